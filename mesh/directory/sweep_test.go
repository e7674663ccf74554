package directory

import (
	"testing"
	"time"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/subjects"
)

// TestUpkeepSweepReachesReclaimedAddress (found in review of 3a5d930): an address
// this node owns throughout, whose claim is re-taken (collected and
// re-activated: a new claim identity) more often than once per sweep round,
// is never re-read by the rotating sweep: each round's snapshot names an
// identity that is gone by the time the round reaches it, and the claims
// made since are only in the next round's snapshot. Its entry, deleted
// behind the owner's back each time (no watch to see it), is never
// re-created. Before 3a5d930 (a cursor on revisions over the claims held
// now) the sweep reached it once per pass.
func TestUpkeepSweepReachesReclaimedAddress(t *testing.T) {
	t.Parallel()
	const others, batch = 5, 2 // a round: 3 sweeps
	ctx, _, a, d := openOne(t, Config{VerifyInterval: time.Hour, VerifyBatch: batch, noWatch: true})
	self := a.Self().Node
	claimMany(t, ctx, d, others, self)
	x := subjects.Address("echo/reclaimed")
	var tok hub.ClaimToken
	for i := range 12 { // four rounds
		if !tok.IsZero() {
			d.Release(tok) // its activation collected …
		}
		g, err := d.Claim(ctx, x) // … and built again: a new claim
		if err != nil || g.Owner != self {
			t.Fatalf("claim %d: %v %v", i, g, err)
		}
		tok = g.Token
		if err := d.kv.Delete(ctx, key(x)); err != nil { // lost, unseen
			t.Fatal(err)
		}
		d.sweep()
		if _, err := d.kv.Get(ctx, key(x)); err == nil {
			return // the sweep read it and re-created it
		}
	}
	t.Fatalf("%s held throughout (its claim re-taken before each sweep) was never re-read by the sweep in %d sweeps (%d claims, batch %d)", x, d.sweeps.Load(), others+1, batch)
}
