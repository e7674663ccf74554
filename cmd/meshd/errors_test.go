package main

import (
	"bytes"
	"io"
	"maps"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nkeys"
	"github.com/spf13/pflag"

	"github.com/natsmesh/natsmesh/daemon"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/profiles"
)

// TestMalformedNATSURL: a malformed --nats-url or MESHD_NATS_URL is bad
// configuration — exit 1, one line naming the flag or the variable and the
// value — not a DNS failure or an unreachable server (exit 2).
func TestMalformedNATSURL(t *testing.T) {
	for _, u := range []string{
		"nats//127.0.0.1::4222", "nats://127.0.0.1::4222", "http://x", "nats://127.0.0.1:0",
		"nats://127.0.0.1:4222,nats//127.0.0.1:4223", " ",
	} {
		code, _, stderr := runMeshd(t, nil, "--nats-url", u, "--http=")
		if code != 1 {
			t.Errorf("--nats-url %q: exit %d (%q), want 1", u, code, stderr)
		}
		oneLineStartingWith(t, stderr, "meshd: ")
		if !strings.Contains(stderr, `"--nats-url"`) || !strings.Contains(stderr, u) {
			t.Errorf("--nats-url %q: stderr %q does not name the flag and the value", u, stderr)
		}
		code, _, stderr = runMeshd(t, map[string]string{"MESHD_NATS_URL": u}, "--http=")
		if code != 1 {
			t.Errorf("MESHD_NATS_URL=%q: exit %d (%q), want 1", u, code, stderr)
		}
		oneLineStartingWith(t, stderr, `meshd: invalid MESHD_NATS_URL="`+u+`"`)
		if strings.Contains(stderr, "lookup") || strings.Contains(stderr, "connect") {
			t.Errorf("%q: reported as a connection failure: %q", u, stderr)
		}
	}
}

// TestLoginRefused: a server refusing the node's login (Authorization
// Violation) is exit 2, as a start that failed, in one line that says the
// login was refused and how to give the node's credentials — naming the
// ones given, if any, and where they came from.
func TestLoginRefused(t *testing.T) {
	s := natstest.RunConfig(t, `authorization: {users: [{user: node, password: secret}]}`)
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"no credentials", nil, nil, "no credentials were given"},
		{"wrong password", nil, []string{"--user", "node", "--password", "wrong"}, "the user and password of --user"},
		{"wrong password from the environment", map[string]string{"MESHD_USER": "node", "MESHD_PASSWORD": "wrong"}, nil, "the user and password of MESHD_USER"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, stderr := runMeshd(t, tc.env, append(tc.args, "--nats-url", s.ClientURL(), "--name", "n1", "--http=", "--log-level=error")...)
			if code != 2 {
				t.Fatalf("exit %d (%q), want 2", code, stderr)
			}
			oneLineStartingWith(t, stderr, "meshd: ")
			for _, want := range []string{"refused the login", "Authorization Violation", tc.want,
				"--creds", "--user", "--password", "--nkey", "node profile"} {
				if !strings.Contains(stderr, want) {
					t.Errorf("stderr %q lacks %q", stderr, want)
				}
			}
		})
	}
}

// TestUserNotPermitted: a login the server takes for a user of another
// profile (client, operator), refused the JetStream API, is exit 2 — a
// start that failed, as meshctl's permission refusals are — in one line
// naming the node profile, not exit 1 (bad input: nothing on meshd's
// command line was wrong).
func TestUserNotPermitted(t *testing.T) {
	m := profiles.Mesh{}
	conf, err := profiles.AccountsConf(m, []profiles.User{
		{User: "node", Password: "np", Profile: profiles.Node(m)},
		{User: "client", Password: "cp", Profile: profiles.Client(m)},
		{User: "operator", Password: "op", Profile: profiles.Operator(m)},
	})
	if err != nil {
		t.Fatal(err)
	}
	s := natstest.RunServer(t, natstest.WithConfig(conf))
	for _, u := range [][2]string{{"client", "cp"}, {"operator", "op"}} {
		code, _, stderr := runMeshd(t, nil, "--nats-url", s.ClientURL(), "--user", u[0], "--password", u[1], "--name", "n1", "--http=", "--log-level=error")
		if code != 2 {
			t.Errorf("as %s: exit %d (%q), want 2", u[0], code, stderr)
		}
		// The last line is meshd's (the log's ERROR lines before it name
		// each refused subject).
		lines := strings.Split(strings.TrimSpace(stderr), "\n")
		if last := lines[len(lines)-1]; !strings.HasPrefix(last, "meshd: ") || !strings.Contains(last, "node profile") {
			t.Errorf("as %s: the last line %q is not meshd's naming the node profile", u[0], last)
		}
	}
}

// envRow is a setting of meshd that it must refuse, naming the variable.
type envRow struct {
	key  string            // the variable whose error it is
	env  map[string]string // the settings, key's among them
	code int               // the exit code
}

// TestEveryVariableNamedInItsError: for every variable meshd reads, a value
// it refuses — by the flag's own parser or check, by a check across two
// settings, or when the start-up tries it (a busy port, a data directory
// that cannot be made) — is an error in one line that names the variable,
// not the flag (a trial met MESHD_DRAIN_TIMEOUT=-1s reported as
// --drain-timeout); the same settings on the command line name the flags.
// A variable without a row here fails the test.
func TestEveryVariableNamedInItsError(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "a-file")
	garbage := filepath.Join(dir, "garbage")
	missing := filepath.Join(dir, "missing")
	seed := filepath.Join(dir, "user.nk")
	user, _ := nkeys.CreateUser()
	s, _ := user.Seed()
	for p, content := range map[string]string{file: "x", garbage: "not a credential\n", seed: string(s)} {
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	inUse := busy.Addr().String()
	ext := "nats://127.0.0.1:1" // never dialed: every row fails first

	rows := []envRow{
		{"MESHD_AUTH", map[string]string{"MESHD_AUTH": "yes"}, 1},
		{"MESHD_AUTH", map[string]string{"MESHD_AUTH": "true", "MESHD_NATS_URL": ext}, 1},
		{"MESHD_AUTH_DIR", map[string]string{"MESHD_AUTH": "true", "MESHD_AUTH_DIR": file}, 1},
		{"MESHD_CALLER_IDENTITY", map[string]string{"MESHD_CALLER_IDENTITY": "account"}, 1},
		{"MESHD_CREDS", map[string]string{"MESHD_CREDS": missing, "MESHD_NATS_URL": ext}, 1},
		{"MESHD_CREDS", map[string]string{"MESHD_CREDS": garbage, "MESHD_NATS_URL": ext}, 1},
		{"MESHD_CREDS", map[string]string{"MESHD_CREDS": dir, "MESHD_NATS_URL": ext}, 1},
		{"MESHD_DATA_DIR", map[string]string{"MESHD_DATA_DIR": file}, 1},
		{"MESHD_DATA_DIR", map[string]string{"MESHD_DATA_DIR": filepath.Join(file, "sub")}, 2},
		{"MESHD_DRAIN_TIMEOUT", map[string]string{"MESHD_DRAIN_TIMEOUT": "-1s"}, 1},
		{"MESHD_DRAIN_TIMEOUT", map[string]string{"MESHD_DRAIN_TIMEOUT": "10"}, 1},
		{"MESHD_KV_CLUSTER", map[string]string{"MESHD_KV_CLUSTER": "east west"}, 1},
		{"MESHD_KV_CLUSTER", map[string]string{"MESHD_KV_CLUSTER": "east.1"}, 1},
		{"MESHD_HEARTBEAT", map[string]string{"MESHD_HEARTBEAT": "-1s"}, 1},
		{"MESHD_HEARTBEAT", map[string]string{"MESHD_HEARTBEAT": "10s"}, 1}, // not under the default TTL
		{"MESHD_HTTP", map[string]string{"MESHD_HTTP": "bogus"}, 1},
		{"MESHD_HTTP", map[string]string{"MESHD_HTTP": "127.0.0.1:99999"}, 1},
		{"MESHD_HTTP", map[string]string{"MESHD_HTTP": inUse}, 2},
		{"MESHD_HUBS", map[string]string{"MESHD_HUBS": "echo,ecko"}, 1},
		{"MESHD_INGRESS_CALLER_BURST", map[string]string{"MESHD_INGRESS_CALLER_BURST": "-1"}, 1},
		{"MESHD_INGRESS_CALLER_RATE", map[string]string{"MESHD_INGRESS_CALLER_RATE": "0"}, 1},
		{"MESHD_INGRESS_CALLER_RATE", map[string]string{"MESHD_INGRESS_CALLER_RATE": "fast"}, 1},
		{"MESHD_CLIENT_INBOXES", map[string]string{"MESHD_CLIENT_INBOXES": "_INBOX.alice,_INBOX..bob"}, 1},
		{"MESHD_INSECURE_LISTEN", map[string]string{"MESHD_INSECURE_LISTEN": "yes"}, 1},
		{"MESHD_KV_REPLICAS", map[string]string{"MESHD_KV_REPLICAS": "-1"}, 1},
		{"MESHD_KV_REPLICAS", map[string]string{"MESHD_KV_REPLICAS": "three"}, 1},
		{"MESHD_LEAF_CREDS", map[string]string{"MESHD_LEAF_CREDS": garbage}, 1},
		{"MESHD_LEAF_REMOTE", map[string]string{"MESHD_LEAF_REMOTE": "http://127.0.0.1:7422"}, 1},
		{"MESHD_LEAF_REMOTE", map[string]string{"MESHD_LEAF_REMOTE": "nats-leaf://hub"}, 1}, // no port
		{"MESHD_LISTEN", map[string]string{"MESHD_LISTEN": "bogus"}, 1},
		{"MESHD_LISTEN", map[string]string{"MESHD_LISTEN": "0.0.0.0:0"}, 1}, // beyond loopback without auth
		{"MESHD_LISTEN", map[string]string{"MESHD_LISTEN": inUse}, 2},
		{"MESHD_LOG_FORMAT", map[string]string{"MESHD_LOG_FORMAT": "xml"}, 1},
		{"MESHD_LOG_LEVEL", map[string]string{"MESHD_LOG_LEVEL": "loud"}, 1},
		{"MESHD_NAME", map[string]string{"MESHD_NAME": "bad.name"}, 1},
		{"MESHD_NAME", map[string]string{"MESHD_NAME": ""}, 1},
		{"MESHD_NATS_URL", map[string]string{"MESHD_NATS_URL": "nats//127.0.0.1::4222"}, 1},
		{"MESHD_NATS_URL", map[string]string{"MESHD_NATS_URL": "nats://127.0.0.1:1"}, 2}, // unreachable
		{"MESHD_NKEY", map[string]string{"MESHD_NKEY": missing, "MESHD_NATS_URL": ext}, 1},
		{"MESHD_NKEY", map[string]string{"MESHD_NKEY": garbage, "MESHD_NATS_URL": ext}, 1},
		{"MESHD_PASSWORD", map[string]string{"MESHD_PASSWORD": "secret", "MESHD_NATS_URL": ext}, 1}, // no user
		{"MESHD_IDLE_TIMEOUT", map[string]string{"MESHD_IDLE_TIMEOUT": "-1s"}, 1},
		{"MESHD_PLACEMENT_WAIT", map[string]string{"MESHD_PLACEMENT_WAIT": "-1s"}, 1},
		{"MESHD_PREFIX", map[string]string{"MESHD_PREFIX": "a..b"}, 1},
		{"MESHD_REPLACE", map[string]string{"MESHD_REPLACE": "on"}, 1},
		{"MESHD_STANDALONE", map[string]string{"MESHD_STANDALONE": "yes"}, 1},
		{"MESHD_STATE_MAX_VALUE", map[string]string{"MESHD_STATE_MAX_VALUE": "-1"}, 1},
		{"MESHD_STATE_REPLICAS", map[string]string{"MESHD_STATE_REPLICAS": "-1"}, 1},
		{"MESHD_TLS_CA", map[string]string{"MESHD_TLS_CA": missing, "MESHD_NATS_URL": ext}, 1},
		{"MESHD_TLS_CA", map[string]string{"MESHD_TLS_CA": garbage, "MESHD_NATS_URL": ext}, 1},
		{"MESHD_TLS_CERT", map[string]string{"MESHD_TLS_CERT": missing, "MESHD_NATS_URL": ext}, 1},
		{"MESHD_TLS_CERT", map[string]string{"MESHD_TLS_CERT": file, "MESHD_NATS_URL": ext}, 1}, // no key
		{"MESHD_TLS_CERT", map[string]string{"MESHD_TLS_CERT": garbage, "MESHD_TLS_KEY": file, "MESHD_NATS_URL": ext}, 1},
		{"MESHD_TLS_KEY", map[string]string{"MESHD_TLS_KEY": missing, "MESHD_NATS_URL": ext}, 1},
		{"MESHD_TLS_KEY", map[string]string{"MESHD_TLS_KEY": file, "MESHD_NATS_URL": ext}, 1}, // no certificate
		{"MESHD_TTL", map[string]string{"MESHD_TTL": "-1s"}, 1},
		{"MESHD_TTL", map[string]string{"MESHD_TTL": "1s"}, 1}, // not above the default heartbeat
		{"MESHD_USER", map[string]string{"MESHD_USER": "node", "MESHD_NKEY": seed, "MESHD_NATS_URL": ext}, 1},
	}
	// Every variable has a row.
	covered := map[string]bool{}
	for _, r := range rows {
		covered[r.key] = true
	}
	withContainerEnv(t, nil)
	newRootCmd(io.Discard, io.Discard, nil).Flags().VisitAll(func(f *pflag.Flag) {
		if f.Name == "help" || f.Name == "version" {
			return
		}
		if key := "MESHD_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_")); !covered[key] {
			t.Errorf("no row for %s (--%s): add a value meshd refuses", key, f.Name)
		}
	})

	base := map[string]string{"MESHD_HTTP": "", "MESHD_LISTEN": "127.0.0.1:0", "MESHD_DATA_DIR": t.TempDir(), "MESHD_NAME": "n1"}
	for _, r := range rows {
		t.Run(r.key+"="+r.env[r.key], func(t *testing.T) {
			env := maps.Clone(base)
			maps.Copy(env, r.env)
			code, stderr := runUntilReady(t, env)
			if code != r.code {
				t.Fatalf("exit %d, want %d; stderr %q", code, r.code, stderr)
			}
			oneLineStartingWith(t, stderr, "meshd: ")
			if !strings.Contains(stderr, r.key) {
				t.Errorf("stderr %q does not name %s", stderr, r.key)
			}
			// On the command line, the same settings name the flag.
			env = maps.Clone(base)
			var args []string
			for k, v := range r.env {
				delete(env, k)
				args = append(args, "--"+strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(k, "MESHD_")), "_", "-")+"="+v)
			}
			flag := "--" + strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(r.key, "MESHD_")), "_", "-")
			code, stderr = runUntilReady(t, env, args...)
			if code != r.code {
				t.Fatalf("%v: exit %d, want %d; stderr %q", args, code, r.code, stderr)
			}
			if !strings.Contains(stderr, flag) || strings.Contains(stderr, r.key) {
				t.Errorf("%v: stderr %q does not name %s (and only it)", args, stderr, flag)
			}
		})
	}
}

// runUntilReady runs meshd with env (no other MESHD_* variable) and args;
// a node that starts after all is drained at once (exit 0).
func runUntilReady(t *testing.T, env map[string]string, args ...string) (int, string) {
	t.Helper()
	withContainerEnv(t, env)
	sig := make(chan os.Signal, 1)
	var out, errb bytes.Buffer
	code := runWith(args, &out, &errb, sig, func(daemon.Info) { sig <- os.Interrupt })
	return code, errb.String()
}
