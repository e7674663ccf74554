package main

import (
	"os"
	"strings"
	"testing"

	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/internal/raceexit"
)

// TestMain keeps the tests off the developer's NATS settings: no nats CLI
// context (an empty XDG_CONFIG_HOME) and none of the variables meshctl
// reads, so every test sets exactly what it means.
func TestMain(m *testing.M) {
	raceexit.Exec() // first: see internal/raceexit
	dir, err := os.MkdirTemp("", "meshctl-test-config-")
	if err != nil {
		panic(err)
	}
	os.Setenv("XDG_CONFIG_HOME", dir)
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "NATS_") || strings.HasPrefix(k, "MESHCTL_") {
			os.Unsetenv(k)
		}
	}
	natstest.RaiseParallel(8)
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
