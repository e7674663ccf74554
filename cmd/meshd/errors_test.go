package main

import (
	"strings"
	"testing"

	"github.com/natsmesh/natsmesh/internal/natstest"
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
