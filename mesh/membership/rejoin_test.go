package membership

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/subjects"
)

// TestRejoinNeverTakesTheNameBack: a process whose generation lost its
// registration rejoins (Config.Rejoin) by superseding that generation at
// once if it is still registered — but when a newer process of its name
// registered meanwhile and heartbeats, the rejoin is refused
// ErrNameInUse and writes nothing: the replacement keeps the name. (A
// fresh-user trial found a woken meshd rejoining with Replace over its
// live replacement.) A rejoin whose replacement stopped heartbeating takes
// the name once it is silent, as any join would.
func TestRejoinNeverTakesTheNameBack(t *testing.T) {
	s := natstest.RunServer(t)
	cfg := Config{Heartbeat: 100 * time.Millisecond, TTL: 2 * time.Second, FencingDelay: time.Second}
	rejoin := func(lost subjects.NodeID) (*Membership, time.Duration, error) {
		c := cfg
		c.Conn, c.Name, c.Kinds, c.Rejoin = natstest.Connect(t, s), "same", []string{"echo"}, lost
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		start := time.Now()
		m, err := Join(ctx, c)
		if m != nil {
			t.Cleanup(m.Close)
		}
		return m, time.Since(start), err
	}

	// Still registered as the lost generation (its heartbeat just
	// stopped: the entry looks fresh): superseded at once.
	old := join(t, natstest.Connect(t, s), "same", cfg)
	lost := old.Self().Node
	old.Close()
	m, took, err := rejoin(lost)
	if err != nil || took > time.Second {
		t.Fatalf("rejoin over its own lost generation: %v after %v; want at once", err, took)
	}
	m.Close()

	// A newer process took the name and heartbeats: refused, nothing
	// written.
	replacement := join(t, natstest.Connect(t, s), "same", Config{Heartbeat: cfg.Heartbeat, TTL: cfg.TTL, FencingDelay: cfg.FencingDelay, Replace: true})
	if _, _, err := rejoin(lost); !errors.Is(err, ErrNameInUse) {
		t.Fatalf("rejoin while a newer generation heartbeats: %v; want ErrNameInUse", err)
	}
	if _, _, err := rejoin(m.Self().Node); !errors.Is(err, ErrNameInUse) {
		t.Fatalf("rejoin of another lost generation while the replacement heartbeats: %v; want ErrNameInUse", err)
	}
	cur, _, err := replacement.readEntry(context.Background(), "same")
	if err != nil || cur.Node != replacement.Self().Node {
		t.Fatalf("the registry names %v (%v); want the replacement %s", cur.Node, err, replacement.Self().Node)
	}

	// The replacement goes silent: the rejoin takes the name once it is.
	replacement.Close()
	if m, _, err := rejoin(lost); err != nil || m.Self().Node.Generation <= replacement.Self().Node.Generation {
		t.Fatalf("rejoin after the replacement went silent: %v", err)
	}
}
