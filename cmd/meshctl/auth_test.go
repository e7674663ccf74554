package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/natsmesh/natsmesh/hubs"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/mesh"
	"github.com/natsmesh/natsmesh/profiles"
)

// pki is a CA with a server certificate for 127.0.0.1 and a client
// certificate, written as PEM files in dir.
type pki struct{ ca, serverCert, serverKey, clientCert, clientKey string }

func newPKI(t *testing.T, dir string) pki {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "natsmesh test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	leaf := func(name string, serial int64, usage x509.ExtKeyUsage) (string, string) {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
			IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kder, _ := x509.MarshalECPrivateKey(key)
		return write(name+".pem", "CERTIFICATE", der), write(name+"-key.pem", "EC PRIVATE KEY", kder)
	}
	p := pki{ca: write("ca.pem", "CERTIFICATE", caDER)}
	p.serverCert, p.serverKey = leaf("server", 2, x509.ExtKeyUsageServerAuth)
	p.clientCert, p.clientKey = leaf("client", 3, x509.ExtKeyUsageClientAuth)
	return p
}

// secureServer runs a server in operator mode (an operator, a system
// account and an application account, as JWTs in a memory resolver) that
// accepts only TLS with a client certificate from the test CA, and returns
// it with the path of a creds file of a user of the application account.
func secureServer(t *testing.T) (*server.Server, pki, string) {
	t.Helper()
	dir := t.TempDir()
	p := newPKI(t, dir)
	op, _ := nkeys.CreateOperator()
	opPub, _ := op.PublicKey()
	opJWT, err := jwt.NewOperatorClaims(opPub).Encode(op)
	if err != nil {
		t.Fatal(err)
	}
	account := func(name string) (nkeys.KeyPair, string, string) {
		kp, _ := nkeys.CreateAccount()
		pub, _ := kp.PublicKey()
		c := jwt.NewAccountClaims(pub)
		c.Name = name
		j, err := c.Encode(op)
		if err != nil {
			t.Fatal(err)
		}
		return kp, pub, j
	}
	_, sysPub, sysJWT := account("SYS")
	acc, accPub, accJWT := account("MESH")
	user, _ := nkeys.CreateUser()
	userPub, _ := user.PublicKey()
	uc := jwt.NewUserClaims(userPub)
	uc.Name = "operator"
	userJWT, err := uc.Encode(acc)
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := user.Seed()
	creds, err := jwt.FormatUserConfig(userJWT, seed)
	if err != nil {
		t.Fatal(err)
	}
	credsFile := filepath.Join(dir, "user.creds")
	opFile := filepath.Join(dir, "op.jwt")
	for f, b := range map[string][]byte{credsFile: creds, opFile: []byte(opJWT)} {
		if err := os.WriteFile(f, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	s := natstest.RunConfig(t, fmt.Sprintf(`
operator: %q
system_account: %s
resolver: MEMORY
resolver_preload: {
  %s: %q
  %s: %q
}
tls {
  cert_file: %q
  key_file: %q
  ca_file: %q
  verify: true
  timeout: 5
}
`, opFile, sysPub, sysPub, sysJWT, accPub, accJWT, p.serverCert, p.serverKey, p.ca), natstest.WithoutJetStream())
	return s, p, credsFile
}

// TestAuthTLSAndCreds: meshctl reaches a mesh on a server that wants TLS
// with a client certificate and a user JWT — by flags, by the nats CLI's
// environment variables, by a nats context named with --context or
// NATS_CONTEXT, and by the selected context — and is refused without them.
func TestAuthTLSAndCreds(t *testing.T) {
	s, p, creds := secureServer(t)
	url := strings.Replace(s.ClientURL(), "nats://", "tls://", 1)
	nc, err := nats.Connect(url, nats.UserCredentials(creds), nats.ClientCert(p.clientCert, p.clientKey), nats.RootCAs(p.ca))
	if err != nil {
		t.Fatalf("node connection: %v", err)
	}
	t.Cleanup(nc.Close)
	node, err := mesh.NewNode(mesh.NodeConfig{Conn: nc, Name: "secure", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	_ = node.Register(hubs.EchoKind, hubs.Echo)
	if err := node.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = node.Close() })

	config := t.TempDir()
	t.Setenv("XDG_CONFIG_HOME", config)
	for _, k := range []string{"NATS_URL", "NATS_CREDS", "NATS_CERT", "NATS_KEY", "NATS_CA", "NATS_CONTEXT", "NATS_USER", "NATS_PASSWORD", "NATS_NKEY"} {
		t.Setenv(k, "")
		os.Unsetenv(k)
	}
	ok := func(t *testing.T, args ...string) {
		t.Helper()
		r := meshctl(t, nil, "", append(args, "request", "echo/sec", "over TLS")...)
		wantCode(t, r, 0)
		if r.stdout != "over TLS" {
			t.Fatalf("stdout %q", r.stdout)
		}
		r = meshctl(t, nil, "", append(args, "nodes", "-o", "json")...)
		wantCode(t, r, 0)
		var st []mesh.NodeStatus
		if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || len(st) != 1 || st[0].Node != node.ID().String() {
			t.Fatalf("nodes: %v %s", err, r.stdout)
		}
	}
	flags := []string{"-s", url, "--creds", creds, "--tls-cert", p.clientCert, "--tls-key", p.clientKey, "--tls-ca", p.ca}

	t.Run("flags", func(t *testing.T) { ok(t, flags...) })
	t.Run("refused without creds or certificate", func(t *testing.T) {
		for _, args := range [][]string{
			{"-s", url, "--tls-cert", p.clientCert, "--tls-key", p.clientKey, "--tls-ca", p.ca},
			{"-s", url, "--creds", creds, "--tls-ca", p.ca},
			{"-s", url, "--creds", creds, "--tls-cert", p.clientCert, "--tls-key", p.clientKey},
		} {
			r := meshctl(t, nil, "", append(args, "nodes")...)
			wantCode(t, r, exitNoNATS)
		}
	})
	t.Run("environment", func(t *testing.T) {
		for k, v := range map[string]string{"NATS_URL": url, "NATS_CREDS": creds, "NATS_CERT": p.clientCert, "NATS_KEY": p.clientKey, "NATS_CA": p.ca} {
			t.Setenv(k, v)
		}
		ok(t)
	})
	ctxDir := filepath.Join(config, "nats", "context")
	if err := os.MkdirAll(ctxDir, 0o700); err != nil {
		t.Fatal(err)
	}
	// The nats CLI's own file format (nats context save writes these keys).
	ctxJSON, _ := json.MarshalIndent(map[string]any{
		"description": "secured mesh", "url": url, "token": "", "user": "", "password": "",
		"creds": creds, "nkey": "", "cert": p.clientCert, "key": p.clientKey, "ca": p.ca,
		"nsc": "", "jetstream_domain": "", "jetstream_api_prefix": "", "jetstream_event_prefix": "",
		"inbox_prefix": "", "user_jwt": "", "color_scheme": "", "tls_first": false,
	}, "", "  ")
	if err := os.WriteFile(filepath.Join(ctxDir, "secure.json"), ctxJSON, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Run("--context", func(t *testing.T) { ok(t, "--context", "secure") })
	t.Run("NATS_CONTEXT", func(t *testing.T) {
		t.Setenv("NATS_CONTEXT", "secure")
		ok(t)
	})
	t.Run("selected context", func(t *testing.T) {
		sel := filepath.Join(config, "nats", "context.txt")
		if err := os.WriteFile(sel, []byte("secure\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		defer os.Remove(sel)
		ok(t)
		// A flag wins over the context: a wrong server is used, and fails,
		// naming the context in use.
		r := meshctl(t, nil, "", "-s", "nats://127.0.0.1:1", "nodes")
		wantCode(t, r, exitNoNATS)
		if !strings.Contains(r.stderr, `with nats context "secure"`) {
			t.Errorf("stderr %q does not name the context", r.stderr)
		}
		// --context '' (or NATS_CONTEXT='') turns the selected context
		// off: the flags alone are used (a fresh-user trial could only
		// `nats context unselect`).
		r = meshctl(t, nil, "", "--context", "", "-s", "nats://127.0.0.1:1", "nodes")
		wantCode(t, r, exitNoNATS)
		if strings.Contains(r.stderr, "nats context") {
			t.Errorf("--context '': stderr %q still names a context", r.stderr)
		}
		t.Setenv("NATS_CONTEXT", "")
		r = meshctl(t, nil, "", "-s", "nats://127.0.0.1:1", "nodes")
		wantCode(t, r, exitNoNATS)
		if strings.Contains(r.stderr, "nats context") {
			t.Errorf("NATS_CONTEXT='': stderr %q still names a context", r.stderr)
		}
		os.Unsetenv("NATS_CONTEXT")
	})
	t.Run("unknown context", func(t *testing.T) {
		r := meshctl(t, nil, "", "--context", "nope", "nodes")
		wantCode(t, r, exitUsage)
		if !strings.Contains(r.stderr, `unknown nats context "nope"`) {
			t.Fatalf("stderr %q", r.stderr)
		}
		wantCode(t, meshctl(t, nil, "", "--context", "../x", "nodes"), exitUsage)
	})
}

// TestPermissionDeniedAtOnce: a meshctl command the NATS user's permission
// profile does not allow fails with exit 2 naming the permissions violation
// as soon as the server reports it — not after --timeout, and not blamed on
// a silent node or a timeout (exit 4).
func TestPermissionDeniedAtOnce(t *testing.T) {
	t.Parallel()
	m := profiles.Mesh{}
	users := []profiles.User{
		{User: "node", Password: "node-secret", Profile: profiles.Node(m)},
		{User: "client", Password: "client-secret", Profile: profiles.Client(m)},
		{User: "operator", Password: "operator-secret", Profile: profiles.Operator(m)},
	}
	conf, err := profiles.AccountsConf(m, users)
	if err != nil {
		t.Fatal(err)
	}
	s := natstest.RunServer(t, natstest.WithConfig(conf))
	nc := natstest.Connect(t, s, nats.UserInfo("node", "node-secret"), nats.CustomInboxPrefix(profiles.NodeInboxPrefix(m.Prefix)))
	node, err := mesh.NewNode(mesh.NodeConfig{Conn: nc, Name: "n1", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := node.Register(hubs.EchoKind, hubs.Echo); err != nil {
		t.Fatal(err)
	}
	if err := node.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = node.Close() })

	as := func(user string, args ...string) result {
		return meshctl(t, s, "", append([]string{"--user", user, "--password", user + "-secret", "--timeout", "60s"}, args...)...)
	}
	// Allowed: the operator lists nodes, the client sends through the ingress.
	wantCode(t, as("operator", "nodes"), 0)
	wantCode(t, as("client", "send", hubs.EchoKind+"/x", "hi"), 0)
	for _, c := range []struct {
		user string
		args []string
	}{
		{"client", []string{"nodes"}},
		{"client", []string{"hubs"}},
		{"client", []string{"state", "get", "kv/settings"}},
		{"client", []string{"drain", "n1"}},
		{"operator", []string{"subscribe", "kv/settings", "--count", "1"}},
	} {
		r := as(c.user, c.args...)
		wantCode(t, r, exitNoNATS)
		if !strings.Contains(r.stderr, "permissions violation") {
			t.Errorf("%s %v: %q does not name the permissions violation", c.user, c.args, r.stderr)
		}
	}
}
