package mesh

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/mesh/directory"
	"github.com/natsmesh/natsmesh/subjects"
)

// TestMovedAddressReadOnce: after an address's owner departs, a burst of
// deliveries to it from many lanes at once reads the directory about once
// — not once per delivery (issue 23: 1 000 reads for 1 000 deliveries) —
// because concurrent misses of one address share a read and the node that
// accepts the first of them is learnt as the owner; and every delivery
// after the burst finds the owner cached (no read at all). The address
// moves to a node that is not the sender, so that the sender learns it
// from an acceptance, not from its own claim.
func TestMovedAddressReadOnce(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	rec := newRecorder()
	a, _ := clusterNodeWith(t, s, "a", rec, steadyMembership)
	b, _ := clusterNodeWith(t, s, "b", rec, steadyMembership)
	c, _ := clusterNodeWith(t, s, "c", rec, steadyMembership)
	waitMembers(t, 3, a, b, c)
	var target subjects.Address
	for i := 0; ; i++ {
		target = subjects.Address(fmt.Sprintf("rec/m%d", i))
		before, _ := directory.Place(target, idsOf(a, b, c))
		after, _ := directory.Place(target, idsOf(a, c))
		if before == b.ID() && after == c.ID() {
			break
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if r, err := a.Deliver(ctx, Delivery{To: target}); err != nil || r.Node != b.ID() {
		t.Fatalf("first delivery: %+v %v", r, err)
	}
	if err := b.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	waitMembers(t, 2, a, c)

	const lanes, each = 256, 4
	reads := a.Directory().Stats().Reads
	var wg sync.WaitGroup
	errs := make(chan error, lanes*each)
	for i := range lanes {
		wg.Go(func() {
			for j := range each {
				r, err := a.Deliver(ctx, Delivery{To: target, Stream: subjects.Stream(fmt.Sprint(i))})
				if err == nil && r.Node != c.ID() {
					err = fmt.Errorf("accepted by %s, want %s", r.Node, c.ID())
				}
				if err != nil {
					errs <- fmt.Errorf("lane %d delivery %d: %w", i, j, err)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	burst := a.Directory().Stats().Reads - reads
	t.Logf("%d deliveries on %d lanes to a moved address: %d directory reads", lanes*each, lanes, burst)
	if burst > lanes/8 {
		t.Errorf("%d directory reads for %d lanes; want a handful (one shared read per miss, the owner learnt from its acceptance)", burst, lanes)
	}
	reads = a.Directory().Stats().Reads
	for i := range 200 {
		if _, err := a.Deliver(ctx, Delivery{To: target, Stream: subjects.Stream(fmt.Sprint(i % 7))}); err != nil {
			t.Fatal(err)
		}
	}
	if n := a.Directory().Stats().Reads - reads; n != 0 {
		t.Errorf("%d directory reads after the burst, want none (the owner is cached)", n)
	}
}
