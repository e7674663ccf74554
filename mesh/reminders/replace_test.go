package reminders

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/verdict"
)

// outcomes counts a runner's outcomes by fire payload.
type outcomes struct {
	mu sync.Mutex
	n  map[string]map[Outcome]int
}

func (o *outcomes) record(f Fire, oc Outcome, _ error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.n == nil {
		o.n = map[string]map[Outcome]int{}
	}
	if o.n[string(f.Payload)] == nil {
		o.n[string(f.Payload)] = map[Outcome]int{}
	}
	o.n[string(f.Payload)][oc]++
}

func (o *outcomes) get(payload string, oc Outcome) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.n[payload][oc]
}

// delivered returns the payloads of the fires rec was given, in order.
func delivered(rec *recorder) []string {
	fires, _ := rec.snapshot()
	var out []string
	for _, f := range fires {
		out = append(out, string(f.Payload))
	}
	return out
}

// A one-shot replaced while its fire is still to be delivered — being
// retried, or waiting for a runner — is never delivered, whatever replaced
// it: another one-shot (which fires too: the server purges both
// schedules, and the reminder's name alone no longer tells them apart), a
// repeating schedule, or a Cancel followed by a new Set. Its fire is
// dropped, the replacement is delivered, and Get and List show only the
// replacement meanwhile. Each shape runs several times, with the
// replacement due at different offsets.
func TestReminderReplacedOneShotFireNeverDelivered(t *testing.T) {
	t.Parallel()
	replacements := []struct {
		name   string
		cancel bool // Cancel before the Set
		every  bool // the replacement repeats
	}{
		{name: "one-shot"},
		{name: "cancel-then-one-shot", cancel: true},
		{name: "every", every: true},
	}
	for _, old := range []string{"retrying", "waiting"} {
		for _, rp := range replacements {
			for round, offset := range []time.Duration{150 * time.Millisecond, 400 * time.Millisecond} {
				t.Run(fmt.Sprintf("%s/%s/%d", old, rp.name, round), func(t *testing.T) {
					t.Parallel()
					replacedOneShot(t, old == "retrying", rp.cancel, rp.every, offset)
				})
			}
		}
	}
}

func replacedOneShot(t *testing.T, retrying, cancel, every bool, offset time.Duration) {
	st := open(t)
	ctx := context.Background()
	const addr, name = "timer/r", "wake"
	var mu sync.Mutex
	oldAttempts := 0
	newDelivered := make(chan struct{})
	var once sync.Once
	rec := &recorder{fail: func(f Fire) error {
		mu.Lock()
		first := string(f.Payload) == "old" && oldAttempts == 0
		if string(f.Payload) == "old" {
			oldAttempts++
		}
		mu.Unlock()
		if first {
			// The old fire's first attempt lasts until the replacement
			// was delivered (a one-shot's schedule is purged by then),
			// and fails transiently: it is retried after that.
			select {
			case <-newDelivered:
			case <-time.After(10 * time.Second):
			}
			return verdict.New(verdict.ReasonHubShuttingDown, "refused once the replacement was delivered")
		}
		if string(f.Payload) == "new" {
			once.Do(func() { close(newDelivered) })
		}
		return nil
	}}
	oc := &outcomes{}
	start := func() { run(t, st, rec, oc.record) }
	if retrying {
		start()
	}
	if _, err := st.Set(ctx, Reminder{Address: addr, Name: name, Schedule: At(time.Now().Add(200 * time.Millisecond)), Payload: []byte("old")}); err != nil {
		t.Fatal(err)
	}
	if retrying {
		natstest.Eventually(t, 10*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return oldAttempts >= 1 }, "the old fire was not attempted")
	} else {
		natstest.Eventually(t, 10*time.Second, func() bool { f, s := pending(t, st); return f == 1 && s == 0 }, "the old one-shot did not fire")
	}
	if cancel {
		if err := st.Cancel(ctx, addr, name); err != nil {
			t.Fatal(err)
		}
	}
	sch := At(time.Now().Add(offset))
	if every {
		sch = Every(time.Second)
	}
	if _, err := st.Set(ctx, Reminder{Address: addr, Name: name, Schedule: sch, Payload: []byte("new")}); err != nil {
		t.Fatal(err)
	}
	if !retrying {
		// Both fires wait (the replacement's schedule too is gone when it
		// is a one-shot): only the replacement is the reminder.
		natstest.Eventually(t, 10*time.Second, func() bool { f, _ := pending(t, st); return f == 2 }, "the replacement did not fire")
		r, err := st.Get(ctx, addr, name)
		if err != nil || string(r.Payload) != "new" || r.Pending == nil {
			t.Fatalf("Get with both fires waiting = %+v, %v; want the replacement, pending", r, err)
		}
		if rs, err := st.List(ctx, addr); err != nil || len(rs) != 1 || string(rs[0].Payload) != "new" {
			t.Fatalf("List with both fires waiting = %+v, %v", rs, err)
		}
		start()
	}
	natstest.Eventually(t, 15*time.Second, func() bool { return oc.get("old", Dropped) == 1 && oc.get("new", Delivered) >= 1 },
		"the old fire was not dropped or the replacement not delivered: %v", lazyOutcomes(oc))
	if got := delivered(rec); slices.Contains(got, "old") {
		t.Fatalf("delivered %q: the replaced one-shot's fire was delivered", got)
	}
	if every {
		return
	}
	// The replacement was delivered: nothing of the reminder is left but
	// expiring tombstones.
	natstest.Eventually(t, 10*time.Second, func() bool { f, _ := pending(t, st); return f == 0 }, "fires remain")
	if _, err := st.Get(ctx, addr, name); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get after the replacement was delivered: %v", err)
	}
	m, err := st.stream.GetLastMsgForSubject(ctx, st.subject("i", addr, name))
	if err != nil || m.Header.Get(HeaderIncarnation) != "" || m.Header.Get(natsTTL) == "" {
		t.Fatalf("incarnation subject after delivery: %+v, %v; want an expiring tombstone", m, err)
	}
}

func lazyOutcomes(o *outcomes) fmt.Stringer {
	return stringer(func() string { o.mu.Lock(); defer o.mu.Unlock(); return fmt.Sprint(o.n) })
}

type stringer func() string

func (s stringer) String() string { return s() }

// A fire delivered while its ack was lost is redelivered; the
// incarnation it belonged to was ended first, so it is dropped, not
// delivered again under a fresh check (its ID would dedupe it at the
// intake too, but only within the dedupe window).
func TestReminderOneShotRedeliveredAfterDeliveryDropped(t *testing.T) {
	t.Parallel()
	st := open(t)
	ctx := context.Background()
	rec := &recorder{}
	oc := &outcomes{}
	run(t, st, rec, oc.record)
	sch := At(time.Now().Add(200 * time.Millisecond))
	r, err := st.Set(ctx, Reminder{Address: "a/ack", Name: "n", Schedule: sch, Payload: []byte("p")})
	if err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 10*time.Second, func() bool { return oc.get("p", Delivered) == 1 }, "not delivered")
	cp, err := st.stream.GetLastMsgForSubject(ctx, st.subject("i", "a/ack", "n"))
	if err != nil {
		t.Fatal(err)
	}
	if cp.Header.Get(HeaderIncarnation) != "" {
		t.Fatalf("incarnation still current after delivery: %v", cp.Header)
	}
	// The fire again, as JetStream redelivers it when an ack was lost: a
	// copy of it, headers as the server stamps them, on its fire subject.
	m := nats.NewMsg(st.subject("f", "a/ack", "n"))
	m.Data = []byte("p")
	m.Header.Set(natsScheduler, st.subject("s", "a/ack", "n"))
	m.Header.Set(natsScheduleNext, "purge")
	m.Header.Set(HeaderSchedule, mustPattern(t, sch))
	m.Header.Set(HeaderIncarnation, r.incarnation)
	m.Header.Set(HeaderTracked, "1")
	if _, err := st.js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 10*time.Second, func() bool { return oc.get("p", Dropped) == 1 }, "the redelivered fire was not dropped: %v", lazyOutcomes(oc))
	if n := len(delivered(rec)); n != 1 {
		t.Fatalf("delivered %d times", n)
	}
}

// An earlier version's stream (three subject families) gains the
// incarnation subjects when a store opens it, and keeps what it held.
func TestReminderStreamUpgradedInPlace(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	ctx := context.Background()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	base := "mesh.v1.rem."
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: StreamName(""), Subjects: []string{base + "s.*.*", base + "f.*.*", base + "x.*.*"},
		Retention: jetstream.WorkQueuePolicy, Storage: jetstream.MemoryStorage, Discard: jetstream.DiscardOld,
		AllowMsgSchedules: true, AllowMsgTTL: true, AllowRollup: true, AllowDirect: true,
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, base+"x.a/1.n", []byte("kept")); err != nil {
		t.Fatal(err)
	}
	st, err := Open(ctx, Config{Conn: nc})
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(info.Config.Subjects, st.streamSubjects()) || info.State.Msgs != 1 {
		t.Fatalf("subjects %v, %d messages", info.Config.Subjects, info.State.Msgs)
	}
	if _, err := st.Set(ctx, Reminder{Address: "a/1", Name: "m", Schedule: Every(time.Hour)}); err != nil {
		t.Fatalf("Set on the upgraded stream: %v", err)
	}
}

func mustPattern(t *testing.T, s Schedule) string {
	t.Helper()
	p, err := s.pattern()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// A nil store (what mesh.Node.Reminders returns without membership) says
// so, instead of panicking.
func TestReminderNilStore(t *testing.T) {
	t.Parallel()
	var st *Store
	ctx := context.Background()
	if _, err := st.Set(ctx, Reminder{Address: "a/1", Name: "n", Schedule: Every(time.Second)}); !errors.Is(err, ErrNoStore) {
		t.Fatalf("Set: %v", err)
	}
	if err := st.Cancel(ctx, "a/1", "n"); !errors.Is(err, ErrNoStore) {
		t.Fatalf("Cancel: %v", err)
	}
	if _, err := st.Get(ctx, "a/1", "n"); !errors.Is(err, ErrNoStore) {
		t.Fatalf("Get: %v", err)
	}
	if _, err := st.List(ctx, ""); !errors.Is(err, ErrNoStore) {
		t.Fatalf("List: %v", err)
	}
	if _, err := st.Run(ctx, RunConfig{Deliver: func(context.Context, Fire) error { return nil }}); !errors.Is(err, ErrNoStore) {
		t.Fatalf("Run: %v", err)
	}
}
