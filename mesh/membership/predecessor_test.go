package membership

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/natsmesh/natsmesh/internal/natstest"
)

// TestPredecessorSupersededAtOnce (issue 24, item 5): a generation whose
// process is proven gone (Config.Predecessors: meshd's data directory lock)
// is superseded at once, without watching it for a TTL and without
// Replace; the new entry names it, and a survivor sees the departure with
// the proof and may take its addresses over at once (no fencing delay). A
// predecessor list that does not name the registered generation proves
// nothing: a live one still refuses the name.
func TestPredecessorSupersededAtOnce(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	long := Config{Heartbeat: 200 * time.Millisecond, TTL: 30 * time.Second, FencingDelay: 10 * time.Second}
	watcher := join(t, natstest.Connect(t, s), "w", long)
	var rec recorder
	watcher.OnEvent(rec.add)
	old := join(t, natstest.Connect(t, s), "same", long)
	natstest.Eventually(t, 5*time.Second, func() bool { return watcher.Alive(old.Self().Node) }, "old joined")
	oldGen := old.Self().Node.Generation

	// Not proven (another generation listed): the live name is refused.
	cfg := long
	cfg.Conn, cfg.Name, cfg.Kinds, cfg.Predecessors = natstest.Connect(t, s), "same", []string{"echo"}, []uint64{oldGen - 1}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	_, err := Join(ctx, cfg)
	cancel()
	if !errors.Is(err, ErrNameInUse) {
		t.Fatalf("join with a predecessor list not naming the live generation: %v; want ErrNameInUse", err)
	}

	// The process of old is gone (its heartbeat stops; the entry stays and
	// looks fresh for a TTL).
	old.Close()
	start := time.Now()
	fresh := join(t, natstest.Connect(t, s), "same", Config{Heartbeat: long.Heartbeat, TTL: long.TTL, FencingDelay: long.FencingDelay, Predecessors: []uint64{oldGen - 7, oldGen}})
	joined := time.Since(start)
	if joined > 2*time.Second {
		t.Errorf("join over a proven-gone generation took %v (TTL %v)", joined, long.TTL)
	}
	if got := fresh.Self().Supersedes; got != oldGen {
		t.Errorf("new entry supersedes %d, want %d", got, oldGen)
	}
	natstest.Eventually(t, 5*time.Second, func() bool { _, ok := rec.find(Superseded, old.Self().Node); return ok }, "superseded")
	e, _ := rec.find(Superseded, old.Self().Node)
	if !strings.Contains(e.Reason, "proved its process gone") {
		t.Errorf("superseded event reason %q", e.Reason)
	}
	if at := watcher.TakeoverAt(old.Self().Node); !at.IsZero() {
		t.Errorf("survivor may take the proven-gone generation's addresses over at %v, want at once (fencing delay %v)", at, long.FencingDelay)
	}
	if at := fresh.TakeoverAt(old.Self().Node); !at.IsZero() {
		t.Errorf("the successor may take its predecessor's addresses over at %v, want at once", at)
	}
	t.Logf("joined over the proven-gone generation in %v (TTL %v, fencing delay %v)", joined, long.TTL, long.FencingDelay)
}
