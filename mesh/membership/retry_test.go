package membership

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/internal/natstest"
)

// syncBuffer is a bytes.Buffer safe for a logger and a test to share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestRetryEachBoundsSilentRequests: a request nobody answers (as
// JetStream's servers stay silent about a stream whose leader is being
// elected or catching up) costs one bounded attempt, not the caller's whole
// deadline: RetryEach tries again with a fresh bound until an answer comes,
// and logs what it waits for meanwhile.
func TestRetryEachBoundsSilentRequests(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t, natstest.WithoutJetStream())
	srv := natstest.Connect(t, s)
	var seen atomic.Int32
	const silent = 3
	if _, err := srv.Subscribe("api.info", func(m *nats.Msg) {
		if seen.Add(1) > silent {
			_ = m.Respond([]byte("ok"))
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := srv.Flush(); err != nil {
		t.Fatal(err)
	}
	nc := natstest.Connect(t, s)
	var logs syncBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	attempts := 0
	err := retryEach(ctx, 200*time.Millisecond, log, "bind the test bucket", func(ctx context.Context) error {
		attempts++
		if _, ok := ctx.Deadline(); !ok {
			t.Error("an attempt without a deadline")
		}
		_, err := nc.RequestWithContext(ctx, "api.info", nil)
		return err
	})
	if err != nil {
		t.Fatalf("RetryEach: %v (after %d attempts)", err, attempts)
	}
	if attempts != silent+1 {
		t.Errorf("%d attempts, want %d (each silent request one attempt)", attempts, silent+1)
	}
	if out := logs.String(); !strings.Contains(out, "waiting for JetStream: bind the test bucket") || !strings.Contains(out, "attempts=1") {
		t.Errorf("log does not say what it waits for:\n%s", out)
	}

	// A caller's deadline still ends it, with the last attempt's error.
	short, cancel2 := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel2()
	err = retryEach(short, 200*time.Millisecond, nil, "never", func(ctx context.Context) error {
		_, err := nc.RequestWithContext(ctx, "api.silent", nil)
		if err == nats.ErrNoResponders {
			<-ctx.Done() // as if a server held the request
			return ctx.Err()
		}
		return err
	})
	if err == nil || short.Err() == nil {
		t.Fatalf("RetryEach past the caller's deadline: %v", err)
	}
}
