package membership

import (
	"testing"
	"time"

	"github.com/natsmesh/natsmesh/internal/natstest"
)

// TestTakeoverWaitsForADurableDeparture: a departure judged from silence is
// taken over only once it is a fact of the registry. Node b's heartbeats
// stop reaching the registry while its connection stays up; w judges it
// expired, but w's removal mark cannot be written (as against a registry
// stream without a leader). b's heartbeats then get through again: its
// lease is held again and it would serve — so w must not have taken b's
// addresses over meanwhile, whatever the fencing delay (the 30-minute
// soak, round 3: a node expired by one survivor resumed 7 s later, its
// entry unmarked). Once w's retried mark is written, b's next heartbeat
// finds it and b's registration is lost; only then does w's takeover time
// run, the fencing delay after the mark.
func TestTakeoverWaitsForADurableDeparture(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	const fencing = 300 * time.Millisecond
	w := join(t, natstest.Connect(t, s), "w", Config{FencingDelay: fencing})
	b := join(t, natstest.Connect(t, s), "b", Config{})
	bn := b.Self().Node
	natstest.Eventually(t, 5*time.Second, func() bool { return w.Alive(bn) }, "w sees b")

	w.failMarks.Store(true)
	b.pauseBeats.Store(true)
	natstest.Eventually(t, 10*time.Second, func() bool { return !w.Alive(bn) && w.Known(bn) }, "w judges b gone")
	judged := time.Now()
	// Well past the fencing delay (and b's TTL): never yet.
	for time.Since(judged) < 3*fencing+w.cfg.TTL {
		if at := w.TakeoverAt(bn); !time.Now().Before(at) {
			t.Fatalf("w may take b over %v after judging it gone, its mark unwritten", time.Since(judged))
		}
		time.Sleep(10 * time.Millisecond)
	}
	b.pauseBeats.Store(false)
	natstest.Eventually(t, 5*time.Second, b.Confirmed, "b's lease held again: nothing in the registry says it is gone")
	resumed := time.Now() // b's last acknowledged heartbeat is no earlier than this
	if at := w.TakeoverAt(bn); !time.Now().Before(at) {
		t.Fatal("w may take b over while b serves again")
	}

	w.failMarks.Store(false)
	natstest.Eventually(t, 10*time.Second, b.IsLost, "b's registration lost once w's retried mark is written")
	w.mu.RLock()
	marked, ok := w.durable[bn]
	w.mu.RUnlock()
	if !ok {
		t.Fatal("b lost, yet w does not hold its departure durable")
	}
	// b renewed its lease after it was judged: it may hold it up to a TTL
	// after its last acknowledged heartbeat, which came before the mark.
	if marked.Before(resumed.Add(w.cfg.TTL)) {
		t.Fatalf("durable from %v, less than a TTL after b renewed its lease (%v)", marked, resumed)
	}
	at := w.TakeoverAt(bn)
	if at.Before(marked.Add(fencing)) {
		t.Fatalf("takeover at %v, before the mark's durability (%v) plus the fencing delay", at, marked)
	}
	natstest.Eventually(t, 5*time.Second, func() bool { return !time.Now().Before(w.TakeoverAt(bn)) }, "takeover allowed after the fencing delay")
}
