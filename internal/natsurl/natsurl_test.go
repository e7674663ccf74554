package natsurl

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

func TestValidate(t *testing.T) {
	for _, ok := range []string{
		"nats://127.0.0.1:4222", "127.0.0.1:4222", "localhost", "nats://localhost", "nats://localhost:",
		"tls://nats-1:4222,tls://nats-2:4222", " nats://a:1 , nats://b:2 ,", "nats://u:p@h:4222", "nats://tok@h",
		"NATS://h:1", "nats://[::1]:4222", "[::1]:4222", "ws://h:8080/path", "wss://h", "nats://h:4222/",
	} {
		if err := Validate(ok); err != nil {
			t.Errorf("Validate(%q) = %v, want nil", ok, err)
		}
	}
	for bad, want := range map[string]string{
		"nats//127.0.0.1::4222":       `no "://" after the scheme`,
		"nats://127.0.0.1::4222":      "too many colons",
		"http://x":                    `scheme "http"`,
		"nats://h:99999":              "port 99999",
		"nats://h:0":                  "port 0",
		"nats://h:x":                  "invalid port",
		"nats://[::1":                 "missing ']'",
		"nats://:4222":                "no host",
		"nats://":                     "no host",
		"":                            "no server URL",
		" , ":                         "no server URL",
		"nats://a:1,nats//b":          `"nats//b": not a NATS URL`,
		"nats://h:1/x":                `path "/x"`,
		"ws://a:1,nats://b:2":         "mixed",
		"nats:h":                      "",
		"nats://h:4222 nats://i:4222": "",
	} {
		err := Validate(bad)
		if err == nil {
			t.Errorf("Validate(%q) = nil, want an error", bad)
			continue
		}
		if msg := err.Error(); !strings.Contains(msg, want) || strings.Contains(msg, "\n") {
			t.Errorf("Validate(%q) = %q, want one line with %q", bad, msg, want)
		}
	}
}

// TestAcceptedURLsParse: every URL Validate accepts, nats.go takes into its
// server pool (it fails to dial it, not to parse it).
func TestAcceptedURLsParse(t *testing.T) {
	for _, u := range []string{"nats://127.0.0.1:1", "127.0.0.1:1", "tls://127.0.0.1:1,nats://127.0.0.1:2", "ws://127.0.0.1:1/p"} {
		if err := Validate(u); err != nil {
			t.Fatal(err)
		}
		_, err := nats.Connect(u, nats.Timeout(time.Second))
		if !errors.Is(err, nats.ErrNoServers) {
			t.Errorf("nats.Connect(%q): %v, want a dial failure", u, err)
		}
	}
}
