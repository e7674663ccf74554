package daemon

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/mesh/membership"
)

// TestProbesAnswerWhileJoining: from the moment meshd binds its HTTP port,
// the probes answer — while the node waits to see whether a registered
// generation of its name still heartbeats (up to a TTL), /healthz is 200
// (alive: a liveness probe must not restart it), /readyz and /metrics 503
// — instead of hanging until the join returns (a fresh-user trial: curl
// hung for the 8 s of the TTL). Here the name's holder heartbeats, so the
// join ends ErrNameInUse.
func TestProbesAnswerWhileJoining(t *testing.T) {
	t.Parallel()
	a := runNode(t, "same", nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	done := make(chan error, 1)
	go func() {
		done <- Run(context.Background(), Config{Name: "same", NATSURL: a.NATSURL, DataDir: t.TempDir(), HTTP: addr,
			TTL: 4 * time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	}()
	client := &http.Client{Timeout: 500 * time.Millisecond}
	status := func(path string) int {
		r, err := client.Get("http://" + addr + path)
		if err != nil {
			return 0
		}
		_, _ = io.Copy(io.Discard, r.Body)
		r.Body.Close()
		return r.StatusCode
	}
	natstest.Eventually(t, 5*time.Second, func() bool { return status("/healthz") == http.StatusOK }, "/healthz answers while joining")
	for _, p := range []string{"/readyz", "/metrics"} {
		if got := status(p); got != http.StatusServiceUnavailable {
			t.Errorf("%s while joining: %d, want 503", p, got)
		}
	}
	select {
	case err := <-done:
		if !errors.Is(err, membership.ErrNameInUse) {
			t.Fatalf("run: %v, want ErrNameInUse", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the join did not end")
	}
	if got := status("/healthz"); got != 0 {
		t.Errorf("/healthz after the run ended: %d, want no answer", got)
	}
}
