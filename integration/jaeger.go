package integration

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// JaegerEnv names an already built Jaeger binary (.ci/run sets it, after
// scripts/jaeger.sh built it). When it is unset, [JaegerBinary] uses the one
// in the user cache if scripts/jaeger.sh (or an earlier run) built it, builds
// one there if JaegerBuildEnv is "1", and otherwise skips the test: the
// build takes minutes on a fresh machine, longer than the README's whole
// test command may.
const (
	JaegerEnv      = "NATSMESH_JAEGER"
	JaegerBuildEnv = "NATSMESH_BUILD_JAEGER"
)

var (
	jaegerOnce sync.Once
	jaegerBin  string
	jaegerErr  error
	jaegerSkip string
)

// JaegerBinary returns a Jaeger built from the tools module tools/jaeger
// (its go.mod pins github.com/jaegertracing/jaeger/cmd/jaeger as a tool;
// its dependencies stay out of natsmesh's go.mod). The binary is cached
// in <user cache dir>/natsmesh/jaeger-<first 12 hex digits of the SHA-256
// of tools/jaeger/go.sum>/jaeger and built only when absent — the first
// build takes minutes (JaegerBuildTime in the log), later runs none.
// $NATSMESH_JAEGER, if set, names the binary instead.
func JaegerBinary(t testing.TB) string {
	t.Helper()
	jaegerOnce.Do(func() {
		if p := os.Getenv(JaegerEnv); p != "" {
			jaegerBin = p
			return
		}
		root, err := moduleRoot()
		if err != nil {
			jaegerErr = err
			return
		}
		jaegerBin, jaegerErr = JaegerCachePath(root)
		if jaegerErr != nil {
			return
		}
		if _, err := os.Stat(jaegerBin); err == nil {
			return
		}
		if os.Getenv(JaegerBuildEnv) != "1" {
			jaegerSkip = fmt.Sprintf("no Jaeger built at %s: run scripts/jaeger.sh, or set %s=1 to build it here (minutes), or %s to a binary (.ci/run does)", jaegerBin, JaegerBuildEnv, JaegerEnv)
			return
		}
		start := time.Now()
		cmd := exec.Command("go", "build", "-o", jaegerBin, "github.com/jaegertracing/jaeger/cmd/jaeger")
		cmd.Dir = filepath.Join(root, "tools", "jaeger")
		if b, err := cmd.CombinedOutput(); err != nil {
			jaegerErr = fmt.Errorf("build jaeger in tools/jaeger: %v\n%s", err, b)
			return
		}
		t.Logf("JaegerBuildTime %v (cached at %s)", time.Since(start).Round(time.Second), jaegerBin)
	})
	if jaegerErr != nil {
		t.Fatalf("integration: %v", jaegerErr)
	}
	if jaegerSkip != "" {
		t.Skip(jaegerSkip)
	}
	return jaegerBin
}

// JaegerCachePath is where JaegerBinary keeps the Jaeger of the tools
// module under root (the natsmesh module's directory).
func JaegerCachePath(root string) (string, error) {
	sum, err := os.ReadFile(filepath.Join(root, "tools", "jaeger", "go.sum"))
	if err != nil {
		return "", err
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	h := sha256.Sum256(sum)
	return filepath.Join(cache, "natsmesh", "jaeger-"+hex.EncodeToString(h[:])[:12], "jaeger"), nil
}

func tcpOpen(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return false
	}
	c.Close()
	return true
}
