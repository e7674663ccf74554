package profiles_test

import (
	"os"
	"strings"
	"testing"

	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/profiles"
)

// DocsCallerAccount is the caller account of the ready server configs
// (docs/operations.md, compose).
const DocsCallerAccount = "CALLERS"

// DocsConf is the ready server config of docs/operations.md §5, the
// production mode for the default mesh: users node and operator in MESH,
// client in CALLERS, passwords from environment variables
// (NATSMESH_NODE_PASSWORD, …), which nats-server resolves when it reads
// the file.
func DocsConf() (string, error) {
	m := profiles.Mesh{}
	return profiles.MultiAccountConf(m, []profiles.User{
		{User: "node", PasswordVar: "NATSMESH_NODE_PASSWORD", Profile: profiles.Node(m)},
		{User: "operator", PasswordVar: "NATSMESH_OPERATOR_PASSWORD", Profile: profiles.Operator(m)},
	}, []profiles.Tenant{{Account: DocsCallerAccount, Users: []profiles.User{
		{User: "client", PasswordVar: "NATSMESH_CLIENT_PASSWORD", Profile: profiles.Client(m)},
	}}})
}

// composeConf is compose's: the same accounts with fixed development
// passwords (the servers publish their ports on loopback only).
func composeConf() (string, error) {
	m := profiles.Mesh{}
	return profiles.MultiAccountConf(m, []profiles.User{
		{User: "node", Password: "dev-node-password", Profile: profiles.Node(m)},
		{User: "operator", Password: "dev-operator-password", Profile: profiles.Operator(m)},
	}, []profiles.Tenant{{Account: DocsCallerAccount, Users: []profiles.User{
		{User: "client", Password: "dev-client-password", Profile: profiles.Client(m)},
	}}})
}

const composeHeader = `# Accounts of compose.yaml's NATS servers, included by nats-N.conf (and of
# compose.supercluster.yaml's, by supercluster/*.conf): the
# permission profiles of package profiles (SECURITY.md) for the default prefix
# mesh.v1, with DEVELOPMENT passwords (the servers publish their ports on
# loopback only). Generated: profiles/docs_test.go checks this file; change the
# passwords (or use nkeys, docs/operations.md §5) before exposing anything.
#
# The production (multi-account) mode: MESH holds the nodes and operators and
# exports the ingress mesh.v1.in.> as a service; the caller account CALLERS
# imports it sharing requestor info, so nodes learn each caller's account and
# user from the server (Nats-Request-Info).
#
#   node      (MESH) meshd (MESHD_USER=node), meshctl subscribe, bench
#   operator  (MESH) meshctl nodes, hubs, stats, drain, send, request, state get
#   client    (CALLERS) callers through the ingress (nats req)

`

// docs/operations.md carries the accounts section for the default mesh
// exactly as package profiles renders it, and deploy/nats/accounts.conf is
// compose's rendering; both parse with nats-server's parser.
func TestDocsAndComposeCarryTheProfiles(t *testing.T) {
	want, err := DocsConf()
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), "```\n"+want+"```\n") {
		t.Errorf("docs/operations.md lacks the rendered accounts section; put this there:\n%s", want)
	}
	for _, v := range []string{"NATSMESH_NODE_PASSWORD", "NATSMESH_CLIENT_PASSWORD", "NATSMESH_OPERATOR_PASSWORD"} {
		t.Setenv(v, "x")
	}
	natstest.RunServer(t, natstest.WithConfig(want))

	compose, err := composeConf()
	if err != nil {
		t.Fatal(err)
	}
	compose = composeHeader + compose
	got, err := os.ReadFile("../deploy/nats/accounts.conf")
	if err != nil || string(got) != compose {
		if os.Getenv("NATSMESH_WRITE_GOLDEN") == "1" {
			if err := os.WriteFile("../deploy/nats/accounts.conf", []byte(compose), 0o644); err != nil {
				t.Fatal(err)
			}
			return
		}
		t.Errorf("deploy/nats/accounts.conf is not the rendered profiles (%v); regenerate with NATSMESH_WRITE_GOLDEN=1 go test ./profiles -run TestDocsAndCompose", err)
	}
	natstest.RunServer(t, natstest.WithConfig(compose))
}
