package membership

import (
	"context"
	"testing"
	"time"

	"github.com/natsmesh/natsmesh/internal/natstest"
)

// TestRemovalToldApartFromLeave: a node that never receives the notice a
// survivor judged a departure by (its own copy of the disconnect advisory,
// its own expiry) learns that departure from the survivor's removal of the
// registry entry, and records it as what it was — never as the
// generation's own leave. Only a generation's own leave reads as Left. The
// removed generation, still running, learns it is lost.
func TestRemovalToldApartFromLeave(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	pub := natstest.Connect(t, s)
	for _, tc := range []struct {
		name string
		want EventType
		act  func(t *testing.T, judge, victim *Membership)
	}{
		{"advisory", Disconnected, func(t *testing.T, judge, victim *Membership) {
			advisory(t, pub, "test.adv.judge", victim, "Client Closed")
		}},
		{"expiry", Expired, func(t *testing.T, judge, victim *Membership) {
			// What the judge's expiry does once the victim is silent
			// past the TTL.
			n := victim.Self().Node
			if !judge.Alive(n) {
				t.Fatal("the judge did not see the victim live")
			}
			judge.judge(n, Expired, time.Time{}, "silent")
		}},
		{"leave", Left, func(t *testing.T, judge, victim *Membership) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := victim.Leave(ctx); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for i := range 10 {
				// The judge alone hears advisories; the bystander hears
				// none (its advisory subject is silent).
				judge := join(t, natstest.Connect(t, s), "judge", Config{AdvisorySubject: "test.adv.judge", Replace: true})
				var rec recorder
				by := join(t, natstest.Connect(t, s), "bystander", Config{AdvisorySubject: "test.adv.silent", Replace: true})
				by.OnEvent(rec.add)
				victim := join(t, natstest.Connect(t, s), "victim", Config{AdvisorySubject: "test.adv.silent", Replace: true})
				n := victim.Self().Node
				natstest.Eventually(t, 5*time.Second, func() bool { return judge.Alive(n) && by.Alive(n) }, "victim joined")
				tc.act(t, judge, victim)
				natstest.Eventually(t, 5*time.Second, func() bool {
					for _, d := range []EventType{Left, Expired, Disconnected, Superseded} {
						if _, ok := rec.find(d, n); ok {
							return true
						}
					}
					return false
				}, "the bystander saw the departure (%d)", i)
				for _, other := range []EventType{Left, Expired, Disconnected, Superseded} {
					if _, ok := rec.find(other, n); ok != (other == tc.want) {
						t.Fatalf("run %d: the bystander recorded %v: %v, want only %v", i, other, ok, tc.want)
					}
				}
				if tc.want != Left {
					e, _ := rec.find(tc.want, n)
					if e.Reason == "" {
						t.Errorf("run %d: the removal's reason was not carried", i)
					}
					select {
					case <-victim.Lost():
					case <-time.After(5 * time.Second):
						t.Fatalf("run %d: the removed generation did not learn it was lost", i)
					}
					cur, _, err := by.readEntry(context.Background(), "victim")
					if err != nil || cur.Node != n || cur.Removed == nil || cur.Removed.event() != tc.want || cur.Removed.By != judge.Self().Node {
						t.Fatalf("run %d: the registry holds %+v (%v), want %s's tombstone marked %v by the judge", i, cur, err, n, tc.want)
					}
				}
				judge.Close()
				by.Close()
				victim.Close()
			}
		})
	}
}
