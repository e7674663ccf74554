package profiles_test

import (
	"os"
	"strings"
	"testing"

	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/profiles"
)

// docsUsers are the users of the ready server config in docs/operations.md:
// passwords from environment variables, which nats-server resolves when it
// reads the file.
func docsUsers(m profiles.Mesh) []profiles.User {
	return []profiles.User{
		{User: "node", PasswordVar: "NATSMESH_NODE_PASSWORD", Profile: profiles.Node(m)},
		{User: "client", PasswordVar: "NATSMESH_CLIENT_PASSWORD", Profile: profiles.Client(m)},
		{User: "operator", PasswordVar: "NATSMESH_OPERATOR_PASSWORD", Profile: profiles.Operator(m)},
	}
}

// composeUsers are compose's: fixed development passwords (the servers
// publish their ports on loopback only).
func composeUsers(m profiles.Mesh) []profiles.User {
	return []profiles.User{
		{User: "node", Password: "dev-node-password", Profile: profiles.Node(m)},
		{User: "client", Password: "dev-client-password", Profile: profiles.Client(m)},
		{User: "operator", Password: "dev-operator-password", Profile: profiles.Operator(m)},
	}
}

const composeHeader = `# Accounts of compose.yaml's NATS servers, included by nats-N.conf: the
# permission profiles of package profiles (SECURITY.md) for the default prefix
# mesh.v1, with DEVELOPMENT passwords (the servers publish their ports on
# loopback only). Generated: profiles/docs_test.go checks this file; change the
# passwords (or use nkeys, docs/operations.md §5) before exposing anything.
#
#   node      meshd (MESHD_USER=node), meshctl subscribe
#   client    callers through the ingress (nats req)
#   operator  meshctl nodes, hubs, stats, drain, send, request

`

// docs/operations.md carries the accounts section for the default mesh
// exactly as package profiles renders it, and deploy/nats/accounts.conf is
// compose's rendering; both parse with nats-server's parser.
func TestDocsAndComposeCarryTheProfiles(t *testing.T) {
	want, err := profiles.AccountsConf(profiles.Mesh{}, docsUsers(profiles.Mesh{}))
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

	compose, err := profiles.AccountsConf(profiles.Mesh{}, composeUsers(profiles.Mesh{}))
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
