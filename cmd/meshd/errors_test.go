package main

import (
	"strings"
	"testing"
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
