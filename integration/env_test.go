package integration

import (
	"os"
	"strings"
	"testing"

	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/internal/raceexit"
)

// TestMain keeps the meshd and meshctl processes the tests start off the
// developer's NATS settings: no nats CLI context (an empty XDG_CONFIG_HOME)
// and none of the NATS_*, MESHD_* or MESHCTL_* variables they read.
func TestMain(m *testing.M) {
	raceexit.Exec() // first: see internal/raceexit
	dir, err := os.MkdirTemp("", "natsmesh-integration-config-")
	if err != nil {
		panic(err)
	}
	os.Setenv("XDG_CONFIG_HOME", dir)
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "NATS_") || strings.HasPrefix(k, "MESHD_") || strings.HasPrefix(k, "MESHCTL_") {
			os.Unsetenv(k)
		}
	}
	natstest.RaiseParallel(4)
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
