package mesh

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/counterhub"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/mesh/directory"
	"github.com/natsmesh/natsmesh/mesh/hubstate"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// stateNode starts a node with membership on s hosting the durable counter
// as kind "ctr".
func stateNode(t *testing.T, s *server.Server, name string, mc MembershipConfig, o counterhub.Options) *Node {
	t.Helper()
	nc := natstest.Connect(t, s)
	n, err := NewNode(NodeConfig{Conn: nc, Name: name, Membership: &mc})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Register("ctr", counterhub.Factory(o)); err != nil {
		t.Fatal(err)
	}
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

func inc(t *testing.T, c *Client, addr subjects.Address) (uint64, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := c.Request(ctx, Delivery{To: addr, Type: counterhub.Inc})
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(string(r.Payload), 10, 64)
}

func storedRecord(t *testing.T, s *server.Server, addr subjects.Address) hub.StateRecord {
	t.Helper()
	r, err := hubstate.Read(context.Background(), bucket(t, s, hubstate.BucketName(subjects.DefaultPrefix)), addr)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestStateSurvivesMoves: a counter's value survives its address moving
// between nodes (drain, close) and back, at every position; each takeover
// bumps the epoch and names the new owner.
func TestStateSurvivesMoves(t *testing.T) {
	s := natstest.RunServer(t)
	a := stateNode(t, s, "a", fastMembership, counterhub.Options{})
	b := stateNode(t, s, "b", fastMembership, counterhub.Options{})
	waitMembers(t, 2, a, b)
	const addr = "ctr/moves"
	var want uint64
	var lastEpoch uint64
	nodes := []*Node{a, b}
	for round := range 4 {
		for range 5 {
			want++
			got, err := inc(t, nodes[round%2].Client, addr)
			if err != nil || got != want {
				t.Fatalf("round %d: inc = %d, %v; want %d", round, got, err, want)
			}
		}
		rec := storedRecord(t, s, addr)
		if rec.Epoch <= lastEpoch || string(rec.Data) != strconv.FormatUint(want, 10) {
			t.Fatalf("round %d: stored %+v (last epoch %d)", round, rec, lastEpoch)
		}
		lastEpoch = rec.Epoch
		// Move it: deactivate on the owner (the claim is released), the
		// next delivery activates it afresh, on whichever node placement
		// picks.
		for _, n := range nodes {
			n.Host().Deactivate(addr)
		}
	}
	// A drained owner hands over as well.
	owner := a
	if storedRecord(t, s, addr).Owner.Name == "b" {
		owner = b
	}
	other := a
	if owner == a {
		other = b
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := owner.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	waitMembers(t, 1, other)
	want++
	if got, err := inc(t, other.Client, addr); err != nil || got != want {
		t.Fatalf("after drain: inc = %d, %v; want %d", got, err, want)
	}
	if rec := storedRecord(t, s, addr); rec.Owner != other.ID() || rec.Epoch <= lastEpoch {
		t.Fatalf("after drain: %+v", rec)
	}
}

// TestStateTooLarge: a save over the store's limit fails with
// hub.ErrStateTooLarge before anything is written; the activation goes on.
func TestStateTooLarge(t *testing.T) {
	s := natstest.RunServer(t)
	mc := fastMembership
	mc.StateMaxValueSize = 64
	nc := natstest.Connect(t, s)
	n, err := NewNode(NodeConfig{Conn: nc, Name: "a", Membership: &mc})
	if err != nil {
		t.Fatal(err)
	}
	var st *hub.State
	err = n.Register("big", func(ctx context.Context, _ subjects.Address) (hub.Hub, error) {
		var err error
		if st, err = hub.LoadState(ctx); err != nil {
			return nil, err
		}
		return hub.HandlerFunc(func(ctx context.Context, d *hub.Delivery) error {
			return st.Save(ctx, d.Payload)
		}), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	if got := n.StateStore().MaxValueSize(); got != 64 {
		t.Fatalf("MaxValueSize = %d", got)
	}
	ctx := context.Background()
	for _, size := range []int{0, 1, 63, 64} {
		if _, err := n.Request(ctx, Delivery{To: "big/x", Payload: make([]byte, size)}); err != nil {
			t.Fatalf("%d bytes: %v", size, err)
		}
	}
	before := storedRecord(t, s, "big/x")
	for _, size := range []int{65, 1000, 100 << 10} {
		_, err := n.Request(ctx, Delivery{To: "big/x", Payload: make([]byte, size)})
		if !errors.Is(err, verdict.ErrHandler) {
			t.Fatalf("%d bytes: %v", size, err)
		}
		if rerr := st.Save(ctx, make([]byte, size)); !errors.Is(rerr, hub.ErrStateTooLarge) {
			t.Fatalf("%d bytes: Save = %v", size, rerr)
		}
	}
	if after := storedRecord(t, s, "big/x"); after.Revision != before.Revision {
		t.Fatalf("an oversized save wrote: revision %d -> %d", before.Revision, after.Revision)
	}
	// Still serving, still saving.
	if _, err := n.Request(ctx, Delivery{To: "big/x", Payload: []byte("ok")}); err != nil {
		t.Fatal(err)
	}
	if got := storedRecord(t, s, "big/x"); string(got.Data) != "ok" {
		t.Fatalf("stored %q", got.Data)
	}
}

// TestStateFencedOnData: an owner whose claim was rewritten behind its back,
// and which does not know it yet (its claim verification is slow), holds a
// turn between its change and its save while a successor takes the state
// over; the stale save fails on the data (hub.ErrStateFenced), its request
// is answered not-the-owner (resendable: nothing persisted), the stale
// activation stands down, and the successor's state is untouched. Repeated
// across several positions of the counter.
func TestStateFencedOnData(t *testing.T) {
	s := natstest.RunServer(t)
	slow := fastMembership
	slow.VerifyInterval = time.Hour // the stale owner does not notice on its own
	gate := make(chan struct{})
	var held sync.WaitGroup
	var mu sync.Mutex
	var fenced []error
	a := stateNode(t, s, "a", slow, counterhub.Options{
		BeforeSave: func(d *hub.Delivery) {
			if string(d.Payload) == "hold" {
				held.Done()
				<-gate
			}
		},
		OnSave: func(_ *hub.Delivery, _ uint64, err error) {
			if err != nil {
				mu.Lock()
				fenced = append(fenced, err)
				mu.Unlock()
			}
		},
	})
	b := stateNode(t, s, "b", fastMembership, counterhub.Options{})
	waitMembers(t, 2, a, b)
	dir := mustDir(t, s)
	ctx := context.Background()
	for i := range 3 {
		addr := subjects.Address(fmt.Sprintf("ctr/fence%d", i))
		// a owns it, with i+1 increments saved.
		if _, err := a.Host().Activate(ctx, addr); err != nil {
			t.Fatal(err)
		}
		for range i + 1 {
			if _, err := inc(t, a.Client, addr); err != nil {
				t.Fatal(err)
			}
		}
		// A turn on a, held between its change and its save.
		held.Add(1)
		res := make(chan error, 1)
		go func() {
			rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			_, err := a.Request(rctx, Delivery{To: addr, Type: counterhub.Inc, Payload: []byte("hold")})
			res <- err
		}()
		held.Wait()
		// The claim is rewritten to b behind a's back; b activates the
		// address and takes its state over.
		claim, _ := json.Marshal(directory.Claim{Owner: b.ID(), Claimed: time.Now()})
		if _, err := dir.Put(ctx, subjects.EncodeToken(string(addr)), claim); err != nil {
			t.Fatal(err)
		}
		release, err := b.Host().Activate(ctx, addr)
		if err != nil {
			t.Fatal(err)
		}
		natstest.Eventually(t, 10*time.Second, func() bool { return storedRecord(t, s, addr).Owner == b.ID() }, "b took the state over")
		taken := storedRecord(t, s, addr)
		close(gate)
		err = <-res
		gate = make(chan struct{})
		if !errors.Is(err, verdict.ErrNotOwner) || !verdict.IsResendable(err) {
			t.Fatalf("%s: the stale owner's request: %v", addr, err)
		}
		mu.Lock()
		if len(fenced) != i+1 || !errors.Is(fenced[i], hub.ErrStateFenced) {
			t.Fatalf("%s: stale saves: %v", addr, fenced)
		}
		mu.Unlock()
		natstest.Eventually(t, 5*time.Second, func() bool {
			for _, x := range a.Host().Addresses() {
				if x == addr {
					return false
				}
			}
			return true
		}, "the stale activation stood down")
		if got := storedRecord(t, s, addr); got.Revision != taken.Revision || string(got.Data) != strconv.Itoa(i+1) {
			t.Fatalf("%s: the stale save wrote: %+v, taken over %+v", addr, got, taken)
		}
		// The successor goes on from the saved value.
		if got, err := inc(t, b.Client, addr); err != nil || got != uint64(i+2) {
			t.Fatalf("%s: successor inc = %d, %v", addr, got, err)
		}
		release()
	}
}

// TestStateFencedLocally: an owner that stood down (its claim lost) before
// its held turn saves fails that save at once with hub.ErrStateFenced.
func TestStateFencedLocally(t *testing.T) {
	s := natstest.RunServer(t)
	gate := make(chan struct{})
	held := make(chan struct{})
	var saveErr error
	a := stateNode(t, s, "a", fastMembership, counterhub.Options{
		BeforeSave: func(d *hub.Delivery) {
			close(held)
			<-gate
		},
		OnSave: func(_ *hub.Delivery, _ uint64, err error) { saveErr = err },
	})
	waitMembers(t, 1, a)
	res := make(chan error, 1)
	go func() {
		_, err := inc(t, a.Client, "ctr/local")
		res <- err
	}()
	<-held
	before := storedRecord(t, s, "ctr/local")
	done := make(chan struct{})
	go func() {
		a.Host().Deactivate("ctr/local") // waits for the held turn
		close(done)
	}()
	natstest.Eventually(t, 5*time.Second, func() bool { return len(a.Host().Addresses()) == 0 }, "deactivated")
	close(gate)
	<-done
	if err := <-res; !errors.Is(err, verdict.ErrNotOwner) {
		t.Fatalf("request: %v", err)
	}
	if !errors.Is(saveErr, hub.ErrStateFenced) {
		t.Fatalf("save: %v", saveErr)
	}
	if after := storedRecord(t, s, "ctr/local"); after.Revision != before.Revision {
		t.Fatal("a stood-down activation wrote")
	}
}

// TestStateWithoutStore: DisableState makes LoadState fail with
// hub.ErrNoStateStore, which fails the build (Unavailable).
func TestStateWithoutStore(t *testing.T) {
	s := natstest.RunServer(t)
	mc := fastMembership
	mc.DisableState = true
	n := stateNode(t, s, "a", mc, counterhub.Options{})
	if n.StateStore() != nil {
		t.Fatal("a store was opened")
	}
	_, err := inc(t, n.Client, "ctr/none")
	if !errors.Is(err, verdict.ErrActivationFailed) {
		t.Fatalf("inc: %v", err)
	}
	js, _ := natstest.Connect(t, s).JetStream()
	if _, err := js.KeyValue(hubstate.BucketName(subjects.DefaultPrefix)); !errors.Is(err, nats.ErrBucketNotFound) {
		t.Fatalf("state bucket: %v", err)
	}
}

// TestStateBatchedSaves: a hub.Batcher counter saves the increments queued
// together with one save: under 64 concurrent callers every increment is
// answered with its own value (1..N, each once), the stored value is N, and
// fewer saves than increments were written.
func TestStateBatchedSaves(t *testing.T) {
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	mc := fastMembership
	n, err := NewNode(NodeConfig{Conn: nc, Name: "a", Membership: &mc})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Register("bctr", counterhub.Factory(counterhub.Options{Batch: true})); err != nil {
		t.Fatal(err)
	}
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	const addr = "bctr/hot"
	if v, err := inc(t, n.Client, addr); err != nil || v != 1 {
		t.Fatalf("first inc: %d, %v", v, err)
	}
	first := storedRecord(t, s, addr).Revision
	const callers, each = 64, 20
	var mu sync.Mutex
	seen := map[uint64]bool{1: true}
	var wg sync.WaitGroup
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				r, err := n.Request(ctx, Delivery{To: addr, Stream: subjects.Stream(strconv.Itoa(c)), Type: counterhub.Inc})
				cancel()
				if err != nil {
					t.Error(err)
					return
				}
				v, _ := strconv.ParseUint(string(r.Payload), 10, 64)
				mu.Lock()
				if seen[v] {
					t.Errorf("value %d answered twice", v)
				}
				seen[v] = true
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	total := uint64(1 + callers*each)
	rec := storedRecord(t, s, addr)
	if string(rec.Data) != strconv.FormatUint(total, 10) || len(seen) != int(total) {
		t.Fatalf("stored %q, %d distinct values, want %d", rec.Data, len(seen), total)
	}
	saves := rec.Revision - first
	if saves >= total-1 {
		t.Errorf("%d saves for %d increments: nothing batched", saves, total-1)
	}
	t.Logf("%d increments by %d callers in %d saves", total-1, callers, saves)
}

// TestStateRememberedIncrement: with counterhub's Remember, an increment
// re-sent under its delivery ID — to the same activation, or to a
// successor after the address moved — is answered the value it got, and
// the stored counter counts it once; the state keeps only the last
// Remember IDs.
func TestStateRememberedIncrement(t *testing.T) {
	s := natstest.RunServer(t)
	o := counterhub.Options{Remember: 3}
	// A node remembers one delivery ID in its intake's dedupe window, so
	// that re-sends reach the hub, whose own memory is under test.
	forgetful := func(name string) *Node {
		mc := fastMembership
		n, err := NewNode(NodeConfig{Conn: natstest.Connect(t, s), Name: name, Membership: &mc, Host: hub.Config{DedupeWindow: 1}})
		if err != nil {
			t.Fatal(err)
		}
		if err := n.Register("ctr", counterhub.Factory(o)); err != nil {
			t.Fatal(err)
		}
		if err := n.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close() })
		return n
	}
	a, b := forgetful("a"), forgetful("b")
	waitMembers(t, 2, a, b)
	const addr = "ctr/remembered"
	send := func(id, typ string) uint64 {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		r, err := a.Client.Request(ctx, Delivery{ID: id, To: addr, Type: typ})
		if err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		v, err := strconv.ParseUint(string(r.Payload), 10, 64)
		if err != nil {
			t.Fatalf("%s: %q", id, r.Payload)
		}
		return v
	}
	stored := func() uint64 {
		t.Helper()
		v, err := counterhub.Value(storedRecord(t, s, addr).Data)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	var n uint64
	for round := range 4 {
		ids := make([]string, 3)
		for i := range ids {
			ids[i] = fmt.Sprintf("r%d-%d", round, i)
			if v := send(ids[i], counterhub.Inc); v != n+uint64(i)+1 {
				t.Fatalf("round %d: %s = %d, want %d", round, ids[i], v, n+uint64(i)+1)
			}
		}
		for move := range 2 {
			for i, id := range ids {
				if v := send(id, counterhub.Inc); v != n+uint64(i)+1 {
					t.Fatalf("round %d move %d: re-sent %s = %d, want %d", round, move, id, v, n+uint64(i)+1)
				}
			}
			if v := stored(); v != n+3 {
				t.Fatalf("round %d move %d: stored %d, want %d", round, move, v, n+3)
			}
			// Move it: the next delivery activates it afresh (a takeover).
			epoch := storedRecord(t, s, addr).Epoch
			for _, nd := range []*Node{a, b} {
				nd.Host().Deactivate(addr)
			}
			natstest.Eventually(t, 10*time.Second, func() bool {
				return send(fmt.Sprintf("get-%d-%d-%d", round, move, time.Now().UnixNano()), counterhub.Get) == n+3 &&
					storedRecord(t, s, addr).Epoch > epoch
			}, "a new activation")
		}
		n += 3
	}
	// The state keeps the last 3 increments' IDs, no more.
	if d := storedRecord(t, s, addr).Data; strings.Count(string(d), "\n") != 3 {
		t.Fatalf("stored state %q: want the counter and 3 IDs", d)
	}
	// The bound is per stream: however many increments another stream
	// sends meanwhile, a stream's last increment stays remembered.
	onStream := func(id, stream string) uint64 {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		r, err := b.Client.Request(ctx, Delivery{ID: id, To: addr, Stream: subjects.Stream(stream), Type: counterhub.Inc})
		if err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		v, _ := strconv.ParseUint(string(r.Payload), 10, 64)
		return v
	}
	first := onStream("slow-1", "slow")
	for i := range 10 {
		onStream(fmt.Sprint("fast-", i), "fast")
	}
	for _, nd := range []*Node{a, b} {
		nd.Host().Deactivate(addr)
	}
	if v := onStream("slow-1", "slow"); v != first {
		t.Fatalf("slow-1 re-sent after 10 increments on another stream: %d, want %d", v, first)
	}
	if v := stored(); v != first+10 {
		t.Fatalf("stored %d, want %d", v, first+10)
	}
}

// lostAckStore is the node's real state store, except that the saves named
// in lose are stored and then reported hub.ErrStateUnknown, as when the
// bucket's acknowledgement is lost (a NATS server dies with it in flight).
type lostAckStore struct {
	*hubstate.Store
	mu        sync.Mutex
	lose      int // saves still to report unknown
	failTakes int // takeovers still to fail, as when the bucket has no leader
}

func (s *lostAckStore) Take(ctx context.Context, addr subjects.Address, owner subjects.NodeID) (hub.StateRecord, error) {
	s.mu.Lock()
	fail := s.failTakes > 0
	if fail {
		s.failTakes--
	}
	s.mu.Unlock()
	if fail {
		return hub.StateRecord{}, fmt.Errorf("%w (last: nats: no response from stream) (test)", context.DeadlineExceeded)
	}
	return s.Store.Take(ctx, addr, owner)
}

func (s *lostAckStore) Save(ctx context.Context, addr subjects.Address, prev hub.StateRecord, data []byte) (hub.StateRecord, error) {
	rec, err := s.Store.Save(ctx, addr, prev, data)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil && s.lose > 0 {
		s.lose--
		return hub.StateRecord{}, fmt.Errorf("%w: the acknowledgement was lost (test)", hub.ErrStateUnknown)
	}
	return rec, err
}

// TestStateUnknownSaveReconciledByResend: a save whose outcome the store
// cannot settle (it was in fact stored) answers its request
// outcome-unknown — not a handler failure — and the activation stands
// down; the node does not pin that answer on the delivery ID, so the
// caller's re-send of the same ID reaches the activation that took the
// state over, which (the counter remembering its increments' IDs) answers
// the stored value: counted once, acknowledged once.
func TestStateUnknownSaveReconciledByResend(t *testing.T) {
	s, _, store, send := lostAckNode(t, "ctr/unknown")
	const addr = "ctr/unknown"
	for i := 1; i <= 3; i++ {
		id := fmt.Sprint("u", i)
		store.mu.Lock()
		store.lose = 1
		store.mu.Unlock()
		_, err := send(id)
		if !errors.Is(err, verdict.ErrOutcomeUnknown) || errors.Is(err, verdict.ErrHandler) {
			t.Fatalf("%s: %v, want outcome-unknown", id, err)
		}
		// Re-sent, it is answered the stored value; again, the same.
		for range 2 {
			var v string
			natstest.Eventually(t, 10*time.Second, func() bool {
				v, err = send(id)
				return err == nil
			}, "%s re-sent is answered", id)
			if v != fmt.Sprint(i) {
				t.Fatalf("%s re-sent: %q, want %d", id, v, i)
			}
		}
		if got, err := counterhub.Value(storedRecord(t, s, addr).Data); err != nil || got != uint64(i) {
			t.Fatalf("after %s: stored %d, %v; want %d", id, got, err, i)
		}
	}
}

// lostAckNode starts a node hosting the remembering counter as "ctr" on a
// lostAckStore, and returns a function that sends an increment to addr
// under an ID.
func lostAckNode(t *testing.T, addr subjects.Address) (*server.Server, *Node, *lostAckStore, func(id string) (string, error)) {
	t.Helper()
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	st, err := hubstate.Open(context.Background(), hubstate.Config{Conn: nc})
	if err != nil {
		t.Fatal(err)
	}
	store := &lostAckStore{Store: st}
	mc := fastMembership
	n, err := NewNode(NodeConfig{Conn: nc, Name: "a", Membership: &mc, Host: hub.Config{State: store}})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Register("ctr", counterhub.Factory(counterhub.Options{Remember: 8})); err != nil {
		t.Fatal(err)
	}
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return s, n, store, func(id string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		r, err := n.Client.Request(ctx, Delivery{ID: id, To: addr, Type: counterhub.Inc})
		return string(r.Payload), err
	}
}

// TestStateBuildFailureResendRebuilds: an activation whose state takeover
// failed (the bucket unreachable for a moment) answers activation-failed;
// the handler never ran, so the node does not pin that answer on the
// delivery ID: the re-send of the same ID builds the hub again and is
// handled, once.
func TestStateBuildFailureResendRebuilds(t *testing.T) {
	s, n, store, send := lostAckNode(t, "ctr/rebuild")
	for i := 1; i <= 3; i++ {
		id := fmt.Sprint("b", i)
		store.mu.Lock()
		store.failTakes = 1
		store.mu.Unlock()
		if _, err := send(id); !errors.Is(err, verdict.ErrActivationFailed) {
			t.Fatalf("%s: %v, want activation-failed", id, err)
		}
		v, err := send(id)
		if err != nil || v != fmt.Sprint(i) {
			t.Fatalf("%s re-sent: %q, %v; want %d", id, v, err, i)
		}
		if got, err := counterhub.Value(storedRecord(t, s, "ctr/rebuild").Data); err != nil || got != uint64(i) {
			t.Fatalf("after %s: stored %d, %v; want %d", id, got, err, i)
		}
		n.Host().Deactivate("ctr/rebuild") // the next delivery builds it again
	}
}

// TestStateDelete: a hub deletes its address's state (the counter's
// "reset"): readers find none, the activation goes on from zero, and after
// a move the next activation starts from no data — its epoch still above
// every earlier one — or from what was saved after the delete.
func TestStateDelete(t *testing.T) {
	s := natstest.RunServer(t)
	a := stateNode(t, s, "a", fastMembership, counterhub.Options{})
	b := stateNode(t, s, "b", fastMembership, counterhub.Options{})
	waitMembers(t, 2, a, b)
	const addr = "ctr/deleted"
	send := func(typ string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		r, err := a.Client.Request(ctx, Delivery{To: addr, Type: typ})
		if err != nil {
			t.Fatalf("%s: %v", typ, err)
		}
		return string(r.Payload)
	}
	move := func() {
		for _, n := range []*Node{a, b} {
			n.Host().Deactivate(addr)
		}
	}
	var epoch uint64
	for round := range 3 {
		for i := 1; i <= 3; i++ {
			if v := send(counterhub.Inc); v != fmt.Sprint(i) {
				t.Fatalf("round %d: inc = %s, want %d", round, v, i)
			}
		}
		rec := storedRecord(t, s, addr)
		if rec.Epoch <= epoch {
			t.Fatalf("round %d: epoch %d after %d", round, rec.Epoch, epoch)
		}
		epoch = rec.Epoch
		if v := send(counterhub.Reset); v != "0" {
			t.Fatalf("reset = %s", v)
		}
		st := bucket(t, s, hubstate.BucketName(subjects.DefaultPrefix))
		if _, err := hubstate.Read(context.Background(), st, addr); !errors.Is(err, hubstate.ErrNotFound) {
			t.Fatalf("round %d: after reset, stored: %v", round, err)
		}
		if round == 1 {
			// The same activation goes on from zero, then it moves.
			if v := send(counterhub.Inc); v != "1" {
				t.Fatalf("inc after reset = %s", v)
			}
			move()
			if v := send(counterhub.Inc); v != "2" {
				t.Fatalf("inc after reset and move = %s", v)
			}
			if rec := storedRecord(t, s, addr); rec.Epoch <= epoch {
				t.Fatalf("epoch %d after %d", rec.Epoch, epoch)
			}
			send(counterhub.Reset)
		}
		move() // the next round's first increment takes the deleted state over
	}
}
