package mesh

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// hopper requests the first address of its payload (a comma-separated
// path) with the rest of it, from its turn's ctx, and responds with its
// own address, ">" and what it got back.
type hopper struct {
	c         *Client
	addr      subjects.Address
	reentrant bool
}

func (h *hopper) Reentrant() bool { return h.reentrant }

func (h *hopper) Handle(ctx context.Context, d *hub.Delivery) error {
	if len(d.Payload) == 0 {
		return d.Respond([]byte(h.addr))
	}
	next, rest, _ := strings.Cut(string(d.Payload), ",")
	r, err := h.c.Request(ctx, Delivery{To: subjects.Address(next), Payload: []byte(rest)})
	if err != nil {
		return err
	}
	return d.Respond([]byte(string(h.addr) + ">" + string(r.Payload)))
}

func hopNode(t *testing.T) *Node {
	t.Helper()
	s := natstest.RunServer(t)
	n, _ := testNode(t, s, "cyc")
	for kind, re := range map[string]bool{"hop": false, "re": true} {
		if err := n.Register(kind, func(_ context.Context, addr subjects.Address) (hub.Hub, error) {
			return &hopper{c: n.Client, addr: addr, reentrant: re}, nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

// A → B → A, and A → A: the inner request is refused call-cycle at once
// (not after the request timeout), and the verdict reaches the outer
// caller through both handlers.
func TestCallCycleFailsAtOnce(t *testing.T) {
	t.Parallel()
	n := hopNode(t)
	for _, tc := range []struct {
		name string
		to   subjects.Address
		path string
	}{
		{"A to B to A", "hop/a", "hop/b,hop/a"},
		{"A to itself", "hop/a", "hop/a"},
		{"A to B to C to B", "hop/a", "hop/b,hop/c,hop/b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			start := time.Now()
			_, err := n.Request(ctx, Delivery{To: tc.to, Payload: []byte(tc.path)})
			if !errors.Is(err, verdict.ErrCallCycle) || verdict.IsTransient(err) {
				t.Fatalf("err = %v, want call-cycle (Failed)", err)
			}
			if el := time.Since(start); el > 2*time.Second {
				t.Fatalf("the cycle took %v to fail", el)
			}
		})
	}
	// Chains without a cycle are untouched.
	r, err := n.Request(context.Background(), Delivery{To: "hop/a", Payload: []byte("hop/b,hop/c")})
	if err != nil || string(r.Payload) != "hop/a>hop/b>hop/c" {
		t.Fatalf("A → B → C: %q %v", r.Payload, err)
	}
	// A request into A from outside the chain (here: after it) is queued
	// as usual.
	if r, err := n.Request(context.Background(), Delivery{To: "hop/a"}); err != nil || string(r.Payload) != "hop/a" {
		t.Fatalf("plain request: %q %v", r.Payload, err)
	}
}

// A kind that opts into reentrancy runs a request of its own chain at
// once, beside the turn that waits on it.
func TestCallCycleReentrantKindRuns(t *testing.T) {
	t.Parallel()
	n := hopNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := n.Request(ctx, Delivery{To: "re/a", Payload: []byte("hop/b,re/a,hop/c")})
	if err != nil || string(r.Payload) != "re/a>hop/b>re/a>hop/c" {
		t.Fatalf("re/a → hop/b → re/a → hop/c: %q %v", r.Payload, err)
	}
	// Reentrancy is for the kind's own chain only: a non-reentrant kind in
	// the cycle still refuses it.
	if _, err := n.Request(ctx, Delivery{To: "re/a", Payload: []byte("hop/b,hop/b")}); !errors.Is(err, verdict.ErrCallCycle) {
		t.Fatalf("re/a → hop/b → hop/b: %v", err)
	}
}
