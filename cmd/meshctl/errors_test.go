package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/natsmesh/natsmesh/internal/natstest"
)

// badURLs are malformed NATS server URLs a trial gave (issue 24) and their
// kin: each is bad input, not an unreachable server.
var badURLs = []string{
	"nats//127.0.0.1::4222", "nats://127.0.0.1::4222", "http://x", "nats://127.0.0.1:99999",
	"nats://127.0.0.1:4222,nats//127.0.0.1:4223", "nats://[::1", " , ",
}

// writeContext saves a nats CLI context file named name under the test's
// own XDG_CONFIG_HOME.
func writeContext(t *testing.T, name string, fields map[string]any) {
	t.Helper()
	config := t.TempDir()
	t.Setenv("XDG_CONFIG_HOME", config)
	dir := filepath.Join(config, "nats", "context")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(fields)
	if err := os.WriteFile(filepath.Join(dir, name+".json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestMalformedURL: a malformed --server, NATS_URL or context URL is bad
// input — exit 1 at once, one line naming where it came from and the value
// — never a DNS or dial failure (exit 2).
func TestMalformedURL(t *testing.T) {
	for _, u := range badURLs {
		for _, src := range []string{"--server", "NATS_URL", "context"} {
			t.Run(src+"="+u, func(t *testing.T) {
				args := []string{"nodes"}
				want := src + "=" + `"` + u + `"`
				switch src {
				case "--server":
					args = append([]string{"--server", u}, args...)
				case "NATS_URL":
					t.Setenv("NATS_URL", u)
				case "context":
					writeContext(t, "prod", map[string]any{"url": u})
					args = append([]string{"--context", "prod"}, args...)
					want = `url "` + u + `" of nats context "prod"`
				}
				start := time.Now()
				r := meshctl(t, nil, "", args...)
				wantCode(t, r, exitUsage)
				if !strings.Contains(r.stderr, want) {
					t.Errorf("stderr %q does not name %s", r.stderr, want)
				}
				if strings.Contains(r.stderr, "cannot connect") || strings.Contains(r.stderr, "lookup") {
					t.Errorf("stderr %q: reported as a connection failure", r.stderr)
				}
				if d := time.Since(start); d > 2*time.Second {
					t.Errorf("took %v: it dialed", d)
				}
			})
		}
	}
	// A well-formed list is dialed: an unreachable one is still exit 2.
	r := meshctl(t, nil, "", "--server", "nats://127.0.0.1:1, 127.0.0.1:2", "nodes")
	wantCode(t, r, exitNoNATS)
}

// TestLoginRefused: a server that refuses the login (Authorization
// Violation) is exit 2 as before, in one line that says the login was
// refused and how to give credentials — naming the ones given, if any, and
// where they came from.
func TestLoginRefused(t *testing.T) {
	s := natstest.RunConfig(t, `authorization: {users: [{user: op, password: secret}]}`)
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"no credentials", nil, nil, "no credentials were given"},
		{"wrong password", nil, []string{"--user", "op", "--password", "wrong"}, "the user and password of --user"},
		{"wrong password from the environment", map[string]string{"NATS_USER": "op", "NATS_PASSWORD": "wrong"}, nil, "the user and password of NATS_USER"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			r := meshctl(t, s, "", append(tc.args, "nodes")...)
			wantCode(t, r, exitNoNATS)
			for _, want := range []string{"refused the login", "Authorization Violation", tc.want,
				"--creds", "--user", "--password", "--nkey", "nats context", "operator profile"} {
				if !strings.Contains(r.stderr, want) {
					t.Errorf("stderr %q lacks %q", r.stderr, want)
				}
			}
		})
	}
	wantCode(t, meshctl(t, s, "", "--user", "op", "--password", "secret", "nodes"), exitVerdict) // logged in; no node
}
