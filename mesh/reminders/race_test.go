package reminders

// Hostile tests (round 3, session 3) of the incarnation fix.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// settled reports whether the stream holds no fire and no schedule
// (tombstones aside).
func settled(t *testing.T, st *Store) bool {
	t.Helper()
	info, err := st.stream.Info(context.Background(), jetstream.WithSubjectFilter(st.base+">"))
	if err != nil {
		t.Fatal(err)
	}
	for subj := range info.State.Subjects {
		switch subj[len(st.base)] {
		case 'f':
			return false
		case 's':
			m, err := st.last(context.Background(), subj) // nil: purged since the info
			if err != nil {
				t.Fatal(err)
			}
			if m != nil && m.Header.Get(HeaderCancelled) == "" {
				return false
			}
		}
	}
	return true
}

// state describes the schedule and incarnation subjects of a reminder
// as Get saw them: schedule incarnation, incarnation subject.
type state struct{ sched, inc string }

func readState(t *testing.T, st *Store, addr subjects.Address, name string) state {
	t.Helper()
	var out state
	for _, fam := range []string{"s", "i"} {
		m, err := st.last(context.Background(), st.subject(fam, addr, name))
		if err != nil {
			t.Fatal(err)
		}
		v := "<none>"
		if m != nil {
			v = m.Header.Get(HeaderIncarnation)
			if m.Header.Get(HeaderCancelled) != "" {
				v = "<tombstone>"
			}
		}
		if fam == "s" {
			out.sched = v
		} else {
			out.inc = v
		}
	}
	return out
}

// byName counts delivered fires per reminder name and payload.
type byName struct {
	mu sync.Mutex
	n  map[string]map[string]int
}

func (b *byName) deliver(_ context.Context, f Fire) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.n == nil {
		b.n = map[string]map[string]int{}
	}
	if b.n[f.Name] == nil {
		b.n[f.Name] = map[string]int{}
	}
	b.n[f.Name][string(f.Payload)]++
	return nil
}

func (b *byName) get(name string) map[string]int {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := map[string]int{}
	for k, v := range b.n[name] {
		out[k] = v
	}
	return out
}

// Several Sets of one one-shot reminder at once (two nodes' hubs, or a
// hub and meshctl): each returns success or ErrConcurrent (another took
// effect instead), Get then names one of them — and that reminder must
// fire. Found by a hostile tester before the schedule's write was made
// conditional on the incarnation subject: The incarnation and the schedule are two
// publishes, so Set B's incarnation, Set C's incarnation and schedule,
// then Set B's schedule leave schedule B with incarnation C: B's fire is
// dropped as not current and nothing is ever delivered.
func TestBreakConcurrentSetsOneShotNeverFires(t *testing.T) {
	t.Parallel()
	st := open(t)
	ctx := context.Background()
	b := &byName{}
	oc := &outcomes{}
	r, err := st.Run(ctx, RunConfig{Deliver: b.deliver, RetryBase: 100 * time.Millisecond, RetryMax: 200 * time.Millisecond, OnOutcome: oc.record})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
	const names, setters = 40, 4
	const addr = "timer/race"
	due := time.Now().Add(2 * time.Second)
	var wg sync.WaitGroup
	var mu sync.Mutex
	succeeded := map[string]map[string]bool{} // name → payloads whose Set returned success
	start := make(chan struct{})
	for i := range names {
		for j := range setters {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				name, pay := fmt.Sprintf("n%d", i), fmt.Sprintf("p%d", j)
				_, err := st.Set(ctx, Reminder{Address: addr, Name: name, Schedule: At(due), Payload: []byte(pay)})
				if err != nil && !errors.Is(err, ErrConcurrent) {
					t.Error(err)
				}
				if err == nil {
					mu.Lock()
					if succeeded[name] == nil {
						succeeded[name] = map[string]bool{}
					}
					succeeded[name][pay] = true
					mu.Unlock()
				}
			}()
		}
	}
	close(start)
	wg.Wait()
	shown := map[string]string{}
	states := map[string]state{}
	for i := range names {
		name := fmt.Sprintf("n%d", i)
		if len(succeeded[name]) == 0 {
			t.Fatalf("no Set of %s succeeded: the last to write its incarnation must", name)
		}
		states[name] = readState(t, st, addr, name)
		g, err := st.Get(ctx, addr, name)
		if errors.Is(err, ErrNotFound) && time.Now().After(due.Add(-100*time.Millisecond)) {
			// Read at or past the due time (a loaded machine: 160 Sets
			// under -race ran long — CI failed here once): the one-shot
			// may have fired and gone, so Get tells nothing; that one
			// of the successful Sets fired is checked below.
			continue
		}
		if err != nil {
			t.Fatalf("Get %s after the Sets: %v", name, err)
		}
		if !succeeded[name][string(g.Payload)] {
			t.Fatalf("Get %s shows %q, set by no successful Set (succeeded: %v)", name, g.Payload, succeeded[name])
		}
		shown[name] = string(g.Payload)
	}
	// Every reminder fires once its due time passed and the stream
	// holds no fire any more.
	natstest.Eventually(t, 15*time.Second, func() bool {
		return time.Now().After(due) && settled(t, st)
	}, "fires or schedules remain")
	var lost []string
	for i := range names {
		name := fmt.Sprintf("n%d", i)
		got := b.get(name)
		fired := got[shown[name]] > 0
		if _, ok := shown[name]; !ok {
			// Get came too late to tell: a successful Set's payload fired.
			fired = false
			for pay := range succeeded[name] {
				fired = fired || got[pay] > 0
			}
		}
		if !fired {
			lost = append(lost, fmt.Sprintf("%s (Get showed %q, succeeded %v, delivered %v, schedule incarnation %s, incarnation subject %s)", name, shown[name], succeeded[name], got, states[name].sched, states[name].inc))
		}
	}
	if len(lost) > 0 {
		t.Fatalf("%d of %d one-shot reminders, each Set successfully, never delivered: %s", len(lost), names, strings.Join(lost, "; "))
	}
}

// A Cancel and a Set of one reminder at once: whatever order they take,
// Get afterwards says whether the reminder exists — and if it shows the
// new one-shot, that one-shot must fire.
func TestBreakCancelRacingSetShownButNeverFires(t *testing.T) {
	t.Parallel()
	st := open(t)
	ctx := context.Background()
	b := &byName{}
	r, err := st.Run(ctx, RunConfig{Deliver: b.deliver, RetryBase: 100 * time.Millisecond, RetryMax: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
	const names = 120
	const addr = "timer/cx"
	for i := range names {
		if _, err := st.Set(ctx, Reminder{Address: addr, Name: fmt.Sprintf("n%d", i), Schedule: Every(time.Hour), Payload: []byte("old")}); err != nil {
			t.Fatal(err)
		}
	}
	due := time.Now().Add(2 * time.Second)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range names {
		name := fmt.Sprintf("n%d", i)
		wg.Add(2)
		go func() {
			defer wg.Done()
			<-start
			if err := st.Cancel(ctx, addr, name); err != nil && !errors.Is(err, ErrNotFound) && !errors.Is(err, ErrConcurrent) {
				t.Error(err)
			}
		}()
		go func() {
			defer wg.Done()
			<-start
			// Spread the Sets over the Cancels' reads and writes.
			time.Sleep(time.Duration(i%30) * 150 * time.Microsecond)
			if _, err := st.Set(ctx, Reminder{Address: addr, Name: name, Schedule: At(due), Payload: []byte("new")}); err != nil && !errors.Is(err, ErrConcurrent) {
				t.Error(err)
			}
		}()
	}
	close(start)
	wg.Wait()
	shown := map[string]bool{}
	states := map[string]state{}
	for i := range names {
		name := fmt.Sprintf("n%d", i)
		g, err := st.Get(ctx, addr, name)
		switch {
		case errors.Is(err, ErrNotFound):
		case err != nil:
			t.Fatal(err)
		case string(g.Payload) == "new":
			shown[name] = true
			states[name] = readState(t, st, addr, name)
		default:
			t.Fatalf("Get %s = %+v", name, g)
		}
	}
	natstest.Eventually(t, 15*time.Second, func() bool {
		return time.Now().After(due) && settled(t, st)
	}, "fires or schedules remain")
	var lost []string
	for name := range shown {
		if b.get(name)["new"] == 0 {
			lost = append(lost, fmt.Sprintf("%s (schedule incarnation %s, incarnation subject %s)", name, states[name].sched, states[name].inc))
		}
	}
	if len(lost) > 0 {
		t.Fatalf("%d of %d reminders shown by Get after a racing Cancel and Set never fired: %v", len(lost), len(shown), lost)
	}
}

// legacyStream creates the stream as the version before the incarnation
// fix did (three subject families) and returns a JetStream handle.
func legacyStream(t *testing.T) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	base := "mesh.v1.rem."
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{
		Name: StreamName(""), Subjects: []string{base + "s.*.*", base + "f.*.*", base + "x.*.*"},
		Retention: jetstream.WorkQueuePolicy, Storage: jetstream.MemoryStorage, Discard: jetstream.DiscardOld,
		AllowMsgSchedules: true, AllowMsgTTL: true, AllowRollup: true, AllowDirect: true,
	}); err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// legacySet publishes a one-shot schedule as the earlier version's Set
// did: no incarnation subject, no Mesh-Reminder-Tracked.
func legacySet(t *testing.T, js jetstream.JetStream, addr subjects.Address, name string, at time.Time, payload string) {
	t.Helper()
	base := "mesh.v1.rem."
	tok := subjects.EncodeToken(string(addr)) + "." + subjects.EncodeToken(name)
	pat := "@at " + at.UTC().Format(atLayout)
	m := nats.NewMsg(base + "s." + tok)
	m.Data = []byte(payload)
	m.Header.Set(natsSchedule, pat)
	m.Header.Set(natsScheduleTarget, base+"f."+tok)
	m.Header.Set(HeaderSchedule, pat)
	m.Header.Set(HeaderIncarnation, "legacy-incarnation-"+payload)
	if _, err := js.PublishMsg(context.Background(), m); err != nil {
		t.Fatal(err)
	}
}

// A one-shot set by the earlier version fired while no runner ran (its
// fire waits, untracked). After the upgrade the reminder is cancelled,
// then set again as a one-shot that fires too: the cancelled fire must
// never be delivered (DESIGN §13: a Cancel drops the fires of the old
// incarnation not yet delivered).
func TestBreakLegacyFireDeliveredAfterCancelAndNewOneShot(t *testing.T) {
	t.Parallel()
	for _, cancel := range []bool{true, false} {
		t.Run(fmt.Sprintf("cancel=%v", cancel), func(t *testing.T) {
			t.Parallel()
			nc, js := legacyStream(t)
			ctx := context.Background()
			const addr, name = "timer/legacy", "wake"
			legacySet(t, js, addr, name, time.Now().Add(100*time.Millisecond), "old")
			st, err := Open(ctx, Config{Conn: nc})
			if err != nil {
				t.Fatal(err)
			}
			natstest.Eventually(t, 10*time.Second, func() bool { f, s := pending(t, st); return f == 1 && s == 0 }, "the legacy one-shot did not fire")
			if cancel {
				if err := st.Cancel(ctx, addr, name); err != nil {
					t.Fatal(err)
				}
				if _, err := st.Get(ctx, addr, name); !errors.Is(err, ErrNotFound) {
					t.Fatalf("Get after Cancel: %v", err)
				}
			}
			if _, err := st.Set(ctx, Reminder{Address: addr, Name: name, Schedule: At(time.Now().Add(100 * time.Millisecond)), Payload: []byte("new")}); err != nil {
				t.Fatal(err)
			}
			natstest.Eventually(t, 10*time.Second, func() bool { f, s := pending(t, st); return f == 2 && s == 0 }, "the new one-shot did not fire")
			rec := &recorder{}
			oc := &outcomes{}
			run(t, st, rec, oc.record)
			natstest.Eventually(t, 10*time.Second, func() bool {
				return oc.get("new", Delivered) == 1 && oc.get("old", Delivered)+oc.get("old", Dropped) == 1
			}, "fires not handled: %v", lazyOutcomes(oc))
			if n := oc.get("old", Delivered); n != 0 {
				t.Fatalf("the cancelled/replaced legacy fire was delivered (%v)", lazyOutcomes(oc))
			}
		})
	}
}

// A one-shot of the earlier version failed for good (its record on
// rem.x, untracked). After the upgrade it is replaced by a new one-shot,
// which is delivered: nothing of the reminder is left, yet Get and List
// bring the replaced one-shot back from its old failure record.
func TestBreakLegacyFailureRecordResurrectedAfterNewOneShot(t *testing.T) {
	t.Parallel()
	nc, js := legacyStream(t)
	ctx := context.Background()
	const addr, name = "timer/legacy", "wake"
	// The earlier version's record of a failed one-shot fire.
	due := time.Now().Add(-time.Minute).UTC().Truncate(time.Millisecond)
	tok := subjects.EncodeToken(addr) + "." + subjects.EncodeToken(name)
	rec := nats.NewMsg("mesh.v1.rem.x." + tok)
	rec.Data = []byte("handler error")
	rec.Header.Set(HeaderIncarnation, "legacy-incarnation")
	rec.Header.Set(HeaderDue, due.Format(time.RFC3339Nano))
	rec.Header.Set(HeaderAttempt, "1")
	rec.Header.Set(HeaderSchedule, "@at "+due.Format(atLayout))
	rec.Header.Set(natsRollup, "sub")
	rec.Header.Set(natsTTL, FailureTTL.String())
	if _, err := js.PublishMsg(ctx, rec); err != nil {
		t.Fatal(err)
	}
	st, err := Open(ctx, Config{Conn: nc})
	if err != nil {
		t.Fatal(err)
	}
	if g, err := st.Get(ctx, addr, name); err != nil || g.LastFailure == nil {
		t.Fatalf("Get of the legacy failure: %+v, %v", g, err)
	}
	if _, err := st.Set(ctx, Reminder{Address: addr, Name: name, Schedule: At(time.Now().Add(200 * time.Millisecond)), Payload: []byte("new")}); err != nil {
		t.Fatal(err)
	}
	oc := &outcomes{}
	run(t, st, &recorder{}, oc.record)
	natstest.Eventually(t, 10*time.Second, func() bool { return oc.get("new", Delivered) == 1 }, "the new one-shot was not delivered")
	natstest.Eventually(t, 10*time.Second, func() bool { f, s := pending(t, st); return f == 0 && s == 0 }, "fires remain")
	if g, err := st.Get(ctx, addr, name); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get after the replacing one-shot was delivered = %+v, %v; want ErrNotFound (the failed one-shot was replaced)", g, err)
	}
}

// A repeating reminder whose fire found no placement for a while, then
// was delivered: Get must not go on saying a fire is being retried.
func TestBreakEveryNoPlacementThenDeliveredStillRetrying(t *testing.T) {
	t.Parallel()
	st := open(t)
	ctx := context.Background()
	var mu sync.Mutex
	attempts := 0
	oc := &outcomes{}
	run(t, st, &recorder{fail: func(f Fire) error {
		mu.Lock()
		defer mu.Unlock()
		attempts++
		if attempts <= 2 {
			return fmt.Errorf("after the placement wait: %w", verdict.ErrNoPlacement)
		}
		return nil
	}}, oc.record)
	const addr, name = "ghost/a", "beat"
	if _, err := st.Set(ctx, Reminder{Address: addr, Name: name, Schedule: Every(3 * time.Second), Payload: []byte("p")}); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 15*time.Second, func() bool { return oc.get("p", Delivered) >= 1 }, "never delivered: %v", lazyOutcomes(oc))
	natstest.Eventually(t, 5*time.Second, func() bool { f, _ := pending(t, st); return f == 0 }, "a fire remains")
	g, err := st.Get(ctx, addr, name)
	if err != nil {
		t.Fatal(err)
	}
	if g.Pending == nil && g.LastFailure != nil && g.LastFailure.Retrying {
		t.Fatalf("after the fire was delivered and none is pending, Get says a fire is still retried: LastFailure=%+v Pending=%v", *g.LastFailure, g.Pending)
	}
}

// Leaks: after many reminders of every kind were delivered or
// cancelled, every subject left in the stream must expire (a tombstone or
// record with Nats-TTL), or belong to a live reminder.
func TestBreakNoSubjectLeftForever(t *testing.T) {
	t.Parallel()
	st := open(t)
	ctx := context.Background()
	oc := &outcomes{}
	fail := func(f Fire) error {
		if strings.HasPrefix(f.Name, "fail") {
			return verdict.ErrHandler
		}
		return nil
	}
	run(t, st, &recorder{fail: fail}, oc.record)
	const addr = "leak/a"
	soon := func() Schedule { return At(time.Now().Add(300 * time.Millisecond)) }
	var cancelAfter []string
	for i := range 10 {
		must := func(_ Reminder, err error) {
			if err != nil {
				t.Fatal(err)
			}
		}
		must(st.Set(ctx, Reminder{Address: addr, Name: fmt.Sprintf("once%d", i), Schedule: soon(), Payload: []byte("os")}))
		must(st.Set(ctx, Reminder{Address: addr, Name: fmt.Sprintf("fail%d", i), Schedule: soon(), Payload: []byte("fail")}))
		// replaced one-shot by one-shot
		must(st.Set(ctx, Reminder{Address: addr, Name: fmt.Sprintf("rep%d", i), Schedule: soon()}))
		must(st.Set(ctx, Reminder{Address: addr, Name: fmt.Sprintf("rep%d", i), Schedule: soon(), Payload: []byte("os")}))
		// every, then cancelled
		must(st.Set(ctx, Reminder{Address: addr, Name: fmt.Sprintf("ev%d", i), Schedule: Every(time.Second)}))
		must(st.Set(ctx, Reminder{Address: addr, Name: fmt.Sprintf("cr%d", i), Schedule: Cron("* * * * * *", "")}))
		cancelAfter = append(cancelAfter, fmt.Sprintf("ev%d", i), fmt.Sprintf("cr%d", i))
		// every replaced by a one-shot
		must(st.Set(ctx, Reminder{Address: addr, Name: fmt.Sprintf("e2o%d", i), Schedule: Every(time.Second)}))
		must(st.Set(ctx, Reminder{Address: addr, Name: fmt.Sprintf("e2o%d", i), Schedule: soon(), Payload: []byte("os")}))
	}
	natstest.Eventually(t, 10*time.Second, func() bool { return oc.get("os", Delivered) >= 30 && oc.get("fail", Failed) >= 10 }, "not delivered: %v", lazyOutcomes(oc))
	for _, n := range cancelAfter {
		if err := st.Cancel(ctx, addr, n); err != nil {
			t.Fatal(err)
		}
	}
	natstest.Eventually(t, 10*time.Second, func() bool { return settled(t, st) }, "fires remain")
	rs, err := st.List(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		if !strings.HasPrefix(r.Name, "fail") {
			t.Errorf("List shows %s after it was delivered or cancelled: %+v", r.Name, r)
		}
	}
	info, err := st.stream.Info(ctx, jetstream.WithSubjectFilter(st.base+">"))
	if err != nil {
		t.Fatal(err)
	}
	for subj := range info.State.Subjects {
		m, err := st.stream.GetLastMsgForSubject(ctx, subj)
		if err != nil {
			t.Fatal(err)
		}
		if m.Header.Get(natsTTL) == "" {
			t.Errorf("subject %s is kept forever: headers %v", subj, m.Header)
		}
	}
}

// Two nodes' runners share the fires of many repeating and one-shot
// reminders, each fire refused transiently on its first attempt (so most
// are waiting for their retry), while the reminders are re-set and
// cancelled at random. A fire of an incarnation that a Set or Cancel had
// ended before the fire's attempt started must never be delivered.
func TestBreakTwoRunnersChurnNoStaleDelivery(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	ctx := context.Background()
	var stores []*Store
	for range 2 {
		st, err := Open(ctx, Config{Conn: natstest.Connect(t, s)})
		if err != nil {
			t.Fatal(err)
		}
		stores = append(stores, st)
	}
	var mu sync.Mutex
	ended := map[string]time.Time{} // payload (incarnation) -> when its Set/Cancel returned
	tried := map[string]bool{}      // fire ID -> tried once
	var violations []string
	deliveredN := 0
	deliver := func(_ context.Context, f Fire) error {
		now := time.Now()
		mu.Lock()
		defer mu.Unlock()
		if !tried[f.ID] {
			tried[f.ID] = true
			return verdict.New(verdict.ReasonHubShuttingDown, "first attempt refused")
		}
		if at, ok := ended[string(f.Payload)]; ok && now.Sub(at) > 300*time.Millisecond {
			violations = append(violations, fmt.Sprintf("%s %s delivered %v after its incarnation ended", f.Name, f.Payload, now.Sub(at)))
		}
		deliveredN++
		return nil
	}
	for _, st := range stores {
		r, err := st.Run(ctx, RunConfig{Deliver: deliver, RetryBase: 150 * time.Millisecond, RetryMax: 300 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(r.Stop)
	}
	const addr = "churn/a"
	const names = 16
	cur := map[string]string{}
	gen := 0
	set := func(st *Store, name string, i int) {
		gen++
		p := fmt.Sprintf("%s-g%d", name, gen)
		sch := Every(time.Second)
		if i%2 == 0 {
			sch = At(time.Now().Add(time.Duration(100+gen%5*100) * time.Millisecond))
		}
		if _, err := st.Set(ctx, Reminder{Address: addr, Name: name, Schedule: sch, Payload: []byte(p)}); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		if old, ok := cur[name]; ok {
			if _, done := ended[old]; !done {
				ended[old] = time.Now()
			}
		}
		mu.Unlock()
		cur[name] = p
	}
	for i := range names {
		set(stores[0], fmt.Sprintf("n%d", i), i)
	}
	deadline := time.Now().Add(8 * time.Second)
	for k := 0; time.Now().Before(deadline); k++ {
		i := k % names
		name := fmt.Sprintf("n%d", i)
		st := stores[k%2]
		if k%3 == 0 {
			err := st.Cancel(ctx, addr, name)
			if err != nil && !errors.Is(err, ErrNotFound) {
				t.Fatal(err)
			}
			mu.Lock()
			if _, done := ended[cur[name]]; !done {
				ended[cur[name]] = time.Now()
			}
			mu.Unlock()
			continue
		}
		set(st, name, i+k)
		// Let fires be produced and wait for their retries.
		time.Sleep(40 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d fires delivered", deliveredN)
	if deliveredN == 0 {
		t.Fatal("nothing delivered")
	}
	if len(violations) > 0 {
		t.Fatalf("%d stale deliveries: %s", len(violations), strings.Join(violations, "; "))
	}
}
