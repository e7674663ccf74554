package reminders

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// lateness is how late a fire may be handed to the deliverer after its
// due time in these tests: the server's scheduling timer runs at most
// every 250 ms, plus the consumer's pull and the race detector.
const lateness = 1500 * time.Millisecond

func open(t *testing.T) *Store {
	t.Helper()
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	st, err := Open(context.Background(), Config{Conn: nc})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// recorder is a Deliverer that records every fire it is given.
type recorder struct {
	mu    sync.Mutex
	fires []Fire
	at    []time.Time
	fail  func(f Fire) error // nil: every delivery succeeds
}

func (r *recorder) deliver(_ context.Context, f Fire) error {
	if r.fail != nil { // outside the lock: it may block one fire while others go on
		if err := r.fail(f); err != nil {
			return err
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fires = append(r.fires, f)
	r.at = append(r.at, time.Now())
	return nil
}

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.fires)
}

func (r *recorder) snapshot() ([]Fire, []time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.fires), slices.Clone(r.at)
}

func run(t *testing.T, st *Store, rec *recorder, outcomes func(Fire, Outcome, error)) *Runner {
	t.Helper()
	r, err := st.Run(context.Background(), RunConfig{Deliver: rec.deliver, RetryBase: 100 * time.Millisecond, RetryMax: 200 * time.Millisecond, OnOutcome: outcomes})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
	return r
}

// pending returns how many fires and schedules the stream holds.
func pending(t *testing.T, st *Store) (fires, schedules int) {
	t.Helper()
	info, err := st.stream.Info(context.Background(), jetstream.WithSubjectFilter(st.base+">"))
	if err != nil {
		t.Fatal(err)
	}
	for subj, n := range info.State.Subjects {
		switch subj[len(st.base)] {
		case 'f':
			fires += int(n)
		case 's':
			schedules += int(n)
		}
	}
	return fires, schedules
}

func TestReminderOneShotFiresOnceAtItsTime(t *testing.T) {
	t.Parallel()
	st := open(t)
	rec := &recorder{}
	run(t, st, rec, nil)
	due := time.Now().Add(1200 * time.Millisecond)
	r, err := st.Set(context.Background(), Reminder{Address: "timer/a", Name: "wake", Schedule: At(due), Type: "tick", Payload: []byte("p")})
	if err != nil {
		t.Fatal(err)
	}
	if r.Revision == 0 {
		t.Fatal("Set returned no revision")
	}
	natstest.Eventually(t, 10*time.Second, func() bool { return rec.count() == 1 }, "the one-shot did not fire")
	fires, at := rec.snapshot()
	f := fires[0]
	if f.Address != "timer/a" || f.Name != "wake" || f.Type != "tick" || string(f.Payload) != "p" || f.Attempt != 1 {
		t.Fatalf("fire = %+v", f)
	}
	if !f.Due.Equal(due.Truncate(time.Millisecond)) {
		t.Fatalf("due = %v, want %v", f.Due, due)
	}
	if late := at[0].Sub(due); late < -50*time.Millisecond || late > lateness {
		t.Fatalf("fired %v after its due time, want within [0, %v]", late, lateness)
	}
	// Once: nothing is left that could fire again (the server purged the
	// schedule with the fire, and the fire was acknowledged).
	natstest.Eventually(t, 5*time.Second, func() bool {
		f, s := pending(t, st)
		return f == 0 && s == 0
	}, "the stream still holds a schedule or fire after a one-shot fired")
	if _, err := st.Get(context.Background(), "timer/a", "wake"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get after the one-shot fired: %v, want ErrNotFound", err)
	}
	if rec.count() != 1 {
		t.Fatalf("fired %d times", rec.count())
	}
}

func TestReminderEveryFiresRepeatedly(t *testing.T) {
	t.Parallel()
	st := open(t)
	rec := &recorder{}
	run(t, st, rec, nil)
	if _, err := st.Set(context.Background(), Reminder{Address: "timer/b", Name: "beat", Schedule: Every(time.Second)}); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 15*time.Second, func() bool { return rec.count() >= 3 }, "the interval fired fewer than 3 times")
	fires, at := rec.snapshot()
	ids := map[string]bool{}
	for i, f := range fires {
		if ids[f.ID] {
			t.Fatalf("fire %d repeats ID %s", i, f.ID)
		}
		ids[f.ID] = true
		if late := at[i].Sub(f.Due); late < -50*time.Millisecond || late > lateness {
			t.Fatalf("fire %d handed over %v after its due time %v", i, late, f.Due)
		}
		if i > 0 && f.Due.Sub(fires[i-1].Due) != time.Second {
			t.Fatalf("due times %v then %v: not one interval apart", fires[i-1].Due, f.Due)
		}
	}
}

func TestReminderCancelStopsItAndDropsWaitingFires(t *testing.T) {
	t.Parallel()
	st := open(t)
	ctx := context.Background()
	if _, err := st.Set(ctx, Reminder{Address: "timer/c", Name: "beat", Schedule: Every(time.Second)}); err != nil {
		t.Fatal(err)
	}
	// No runner yet: fires wait in the stream.
	natstest.Eventually(t, 10*time.Second, func() bool { f, _ := pending(t, st); return f >= 1 }, "no fire produced")
	if err := st.Cancel(ctx, "timer/c", "beat"); err != nil {
		t.Fatal(err)
	}
	waiting, _ := pending(t, st)
	var mu sync.Mutex
	dropped := 0
	rec := &recorder{}
	run(t, st, rec, func(_ Fire, o Outcome, _ error) {
		if o == Dropped {
			mu.Lock()
			dropped++
			mu.Unlock()
		}
	})
	natstest.Eventually(t, 10*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		f, _ := pending(t, st)
		return dropped >= waiting && f == 0
	}, "the fires waiting at the cancel were not dropped")
	if rec.count() != 0 {
		t.Fatalf("%d fires of a cancelled reminder delivered", rec.count())
	}
	if _, err := st.Get(ctx, "timer/c", "beat"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get after Cancel: %v", err)
	}
	if err := st.Cancel(ctx, "timer/c", "beat"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second Cancel: %v, want ErrNotFound", err)
	}
	// The server holds no schedule any more: the tombstone is the
	// subject's only message, and no fire is produced.
	subj := st.subject("s", "timer/c", "beat")
	info, err := st.stream.Info(ctx, jetstream.WithSubjectFilter(subj))
	if err != nil || info.State.Subjects[subj] != 1 {
		t.Fatalf("schedule subject holds %v messages (%v)", info.State.Subjects[subj], err)
	}
}

func TestReminderSetReplacesAndListShowsIt(t *testing.T) {
	t.Parallel()
	st := open(t)
	ctx := context.Background()
	at := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	for _, r := range []Reminder{
		{Address: "a/1", Name: "x", Schedule: At(at), Type: "t1", Payload: []byte("one")},
		{Address: "a/1", Name: "y", Schedule: Every(90 * time.Second)},
		{Address: "a/2 with space", Name: "z", Schedule: Cron("0 0 9 * * *", "Europe/Paris")},
		{Address: "a/1", Name: "x", Schedule: At(at.Add(time.Minute)), Type: "t2"}, // replaces the first
	} {
		if _, err := st.Set(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	all, err := st.List(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range all {
		got = append(got, fmt.Sprintf("%s|%s|%s|%s|%s", r.Address, r.Name, r.Schedule, r.Type, r.Payload))
		if r.Revision == 0 || r.Set.IsZero() {
			t.Fatalf("%+v lacks revision or set time", r)
		}
	}
	want := []string{
		"a/1|x|@at " + at.Add(time.Minute).UTC().Format(atLayout) + "|t2|",
		"a/1|y|@every 1m30s||",
		"a/2 with space|z|0 0 9 * * * in Europe/Paris||",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("List = %q\nwant   %q", got, want)
	}
	one, err := st.List(ctx, "a/1")
	if err != nil || len(one) != 2 {
		t.Fatalf("List(a/1) = %v, %v", one, err)
	}
	if err := st.Cancel(ctx, "a/1", "y"); err != nil {
		t.Fatal(err)
	}
	if one, _ = st.List(ctx, "a/1"); len(one) != 1 || one[0].Name != "x" {
		t.Fatalf("List after Cancel = %v", one)
	}
}

func TestReminderInvalid(t *testing.T) {
	t.Parallel()
	st := open(t)
	for _, tc := range []struct {
		name string
		r    Reminder
	}{
		{"no address", Reminder{Name: "n", Schedule: Every(time.Second)}},
		{"no name", Reminder{Address: "a/b", Schedule: Every(time.Second)}},
		{"space in name", Reminder{Address: "a/b", Name: "a b", Schedule: Every(time.Second)}},
		{"long name", Reminder{Address: "a/b", Name: string(make([]byte, MaxNameLen+1)), Schedule: Every(time.Second)}},
		{"no schedule", Reminder{Address: "a/b", Name: "n"}},
		{"two schedules", Reminder{Address: "a/b", Name: "n", Schedule: Schedule{At: time.Now(), Every: time.Second}}},
		{"short interval", Reminder{Address: "a/b", Name: "n", Schedule: Every(500 * time.Millisecond)}},
		{"fractional interval", Reminder{Address: "a/b", Name: "n", Schedule: Every(1500 * time.Millisecond)}}, // the server fires it every 2 s
		{"zone without cron", Reminder{Address: "a/b", Name: "n", Schedule: Schedule{Every: time.Second, TimeZone: "UTC"}}},
		{"bad zone", Reminder{Address: "a/b", Name: "n", Schedule: Cron("@daily", "Mars/Olympus")}},
		{"five-field cron", Reminder{Address: "a/b", Name: "n", Schedule: Cron("*/5 * * * *", "")}},
		{"unknown macro", Reminder{Address: "a/b", Name: "n", Schedule: Cron("@fortnightly", "")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := st.Set(context.Background(), tc.r); !errors.Is(err, ErrInvalidReminder) {
				t.Fatalf("Set: %v, want ErrInvalidReminder", err)
			}
		})
	}
	// A six-field cron expression the server cannot parse is refused by
	// the server.
	if _, err := st.Set(context.Background(), Reminder{Address: "a/b", Name: "n", Schedule: Cron("a b c d e f", "")}); err == nil {
		t.Fatal("Set with a bad cron expression succeeded")
	}
}

// A fire whose delivery fails transiently is redelivered with the same ID
// and handled once; one that fails for good is recorded, not retried.
func TestReminderRetriedWithItsIDThenRecordedWhenHopeless(t *testing.T) {
	t.Parallel()
	st := open(t)
	ctx := context.Background()
	var mu sync.Mutex
	attempts := map[string][]string{} // name → IDs attempted
	rec := &recorder{fail: func(f Fire) error {
		mu.Lock()
		defer mu.Unlock()
		attempts[f.Name] = append(attempts[f.Name], f.ID)
		switch {
		case f.Name == "flaky" && len(attempts[f.Name]) == 1:
			return verdict.New(verdict.ReasonHubShuttingDown, "first attempt refused")
		case f.Name == "hopeless":
			return verdict.New(verdict.ReasonHandlerError, "handler broke")
		}
		return nil
	}}
	run(t, st, rec, nil)
	due := time.Now().Add(500 * time.Millisecond)
	for _, n := range []string{"flaky", "hopeless"} {
		if _, err := st.Set(ctx, Reminder{Address: "a/r", Name: n, Schedule: At(due)}); err != nil {
			t.Fatal(err)
		}
	}
	natstest.Eventually(t, 10*time.Second, func() bool {
		f, _ := pending(t, st)
		return rec.count() == 1 && f == 0
	}, "the flaky fire was not delivered, or fires remain")
	mu.Lock()
	flaky, hopeless := slices.Clone(attempts["flaky"]), slices.Clone(attempts["hopeless"])
	mu.Unlock()
	if len(flaky) != 2 || flaky[0] != flaky[1] {
		t.Fatalf("flaky attempts %v: want two with one ID", flaky)
	}
	if len(hopeless) != 1 {
		t.Fatalf("hopeless fire attempted %d times, want 1", len(hopeless))
	}
	// The failure is recorded on the reminder (a one-shot's schedule is
	// gone once fired, so it is read from the record itself).
	m, err := st.stream.GetLastMsgForSubject(ctx, st.subject("x", "a/r", "hopeless"))
	if err != nil || string(m.Data) == "" || m.Header.Get(HeaderDue) == "" {
		t.Fatalf("no failure record: %v", err)
	}
}

func TestReminderRecordedFailureShowsInGet(t *testing.T) {
	t.Parallel()
	st := open(t)
	ctx := context.Background()
	rec := &recorder{fail: func(Fire) error { return verdict.New(verdict.ReasonUnknownKind, "no such kind") }}
	run(t, st, rec, nil)
	if _, err := st.Set(ctx, Reminder{Address: "nokind/r", Name: "beat", Schedule: Every(time.Second)}); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 10*time.Second, func() bool {
		r, err := st.Get(ctx, "nokind/r", "beat")
		return err == nil && r.LastFailure != nil
	}, "the failure is not shown")
	r, _ := st.Get(ctx, "nokind/r", "beat")
	if r.LastFailure.Due.IsZero() || r.LastFailure.Error == "" {
		t.Fatalf("LastFailure = %+v", r.LastFailure)
	}
}

// Many reminders due at once each fire once, shared by two runners (two
// nodes' connections). Lateness is logged: see BENCHMARKS.md.
func TestReminderManyFireOnceEach(t *testing.T) {
	t.Parallel()
	const n = 1000
	s := natstest.RunServer(t)
	ctx := context.Background()
	var stores []*Store
	rec := &recorder{}
	var mu sync.Mutex
	perRunner := map[int]int{}
	for i := range 2 {
		st, err := Open(ctx, Config{Conn: natstest.Connect(t, s)})
		if err != nil {
			t.Fatal(err)
		}
		stores = append(stores, st)
		run(t, st, rec, func(_ Fire, o Outcome, _ error) {
			if o == Delivered {
				mu.Lock()
				perRunner[i]++
				mu.Unlock()
			}
		})
	}
	due := time.Now().Add(3 * time.Second)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := stores[i%2].Set(ctx, Reminder{Address: subjects.Address(fmt.Sprintf("many/%d", i)), Name: "once", Schedule: At(due)})
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if time.Now().After(due) {
		t.Skip("setting the reminders took past their due time on this machine")
	}
	natstest.Eventually(t, 60*time.Second, func() bool { return rec.count() >= n }, "not every reminder fired")
	natstest.Eventually(t, 10*time.Second, func() bool { f, s := pending(t, stores[0]); return f == 0 && s == 0 }, "fires or schedules remain")
	fires, at := rec.snapshot()
	if len(fires) != n {
		t.Fatalf("%d deliveries for %d reminders", len(fires), n)
	}
	seen := map[subjects.Address]bool{}
	var late []time.Duration
	for i, f := range fires {
		if seen[f.Address] {
			t.Fatalf("%s fired twice", f.Address)
		}
		seen[f.Address] = true
		late = append(late, at[i].Sub(f.Due))
	}
	slices.Sort(late)
	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d one-shots due at once: handed over within %v (p50 %v, p99 %v), runners %v",
		n, at[len(at)-1].Sub(due), late[n/2], late[n*99/100], perRunner)
}

// TestFireIDGolden pins the fire ID derivation of docs/protocol.md §8d for
// other implementations (checked there with sha256sum).
func TestFireIDGolden(t *testing.T) {
	t.Parallel()
	if got := FireID("timer/a", "wake", "inc", "2026-01-01T09:00:00.000Z"); got != "rem-20ee50c7fe02c3b2834d3239b703b374" {
		t.Fatalf("FireID = %s", got)
	}
}

// A fire whose address's kind no node hosts is retried, and meanwhile
// List and Get show it (the one-shot's schedule is gone: the server purged
// it when it fired) with its pending fire and the recorded no-placement
// failure; Cancel drops the pending fire.
func TestReminderNoPlacementFireListedAndCancellable(t *testing.T) {
	t.Parallel()
	st := open(t)
	ctx := context.Background()
	rec := &recorder{fail: func(Fire) error { return fmt.Errorf("after the placement wait: %w", verdict.ErrNoPlacement) }}
	runner := run(t, st, rec, nil)
	due := time.Now().Add(300 * time.Millisecond).Truncate(time.Millisecond)
	if _, err := st.Set(ctx, Reminder{Address: "ecko/c", Name: "c6", Schedule: At(due), Type: "t"}); err != nil {
		t.Fatal(err)
	}
	var got Reminder
	natstest.Eventually(t, 10*time.Second, func() bool {
		rs, err := st.List(ctx, "ecko/c")
		if err != nil || len(rs) != 1 {
			return false
		}
		got = rs[0]
		return got.Pending != nil && got.LastFailure != nil && got.Pending.Retried >= 2
	}, "the retried fire is not listed with its pending fire and failure")
	if got.Name != "c6" || !got.Schedule.At.Equal(due) || got.Type != "t" || !got.Pending.Due.Equal(due) ||
		!got.LastFailure.Retrying || !strings.Contains(got.LastFailure.Error, "no live node") {
		t.Fatalf("listed %+v pending %+v failure %+v", got, got.Pending, got.LastFailure)
	}
	if runner.Stats().Retried < 2 {
		t.Fatalf("stats %+v", runner.Stats())
	}
	if err := st.Cancel(ctx, "ecko/c", "c6"); err != nil {
		t.Fatalf("Cancel of a reminder with only a pending fire: %v", err)
	}
	natstest.Eventually(t, 10*time.Second, func() bool { f, _ := pending(t, st); return f == 0 }, "the cancelled fire was not dropped")
	if rs, err := st.List(ctx, ""); err != nil || len(rs) != 0 {
		t.Fatalf("List after Cancel: %v %+v", err, rs)
	}
	err := st.Cancel(ctx, "ecko/c", "c6")
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "ecko/c c6") {
		t.Fatalf("second Cancel: %v", err)
	}
}

// A one-shot whose fire failed hopelessly is listed with its failure
// (nothing else is left of it), and Cancel clears it.
func TestReminderOneShotFailureListed(t *testing.T) {
	t.Parallel()
	st := open(t)
	ctx := context.Background()
	rec := &recorder{fail: func(Fire) error { return verdict.New(verdict.ReasonHandlerError, "handler broke") }}
	run(t, st, rec, nil)
	due := time.Now().Add(300 * time.Millisecond).Truncate(time.Millisecond)
	if _, err := st.Set(ctx, Reminder{Address: "a/once", Name: "n", Schedule: At(due), Type: "t", Payload: []byte("p")}); err != nil {
		t.Fatal(err)
	}
	var got []Reminder
	natstest.Eventually(t, 10*time.Second, func() bool {
		f, s := pending(t, st)
		got, _ = st.List(ctx, "a/once")
		return f == 0 && s == 0 && len(got) == 1 && got[0].LastFailure != nil
	}, "the failed one-shot is not listed")
	r := got[0]
	if r.Pending != nil || r.LastFailure.Retrying || !r.Schedule.At.Equal(due) || r.Type != "t" || r.LastFailure.Attempt != 1 {
		t.Fatalf("listed %+v failure %+v", r, r.LastFailure)
	}
	if err := st.Cancel(ctx, "a/once", "n"); err != nil {
		t.Fatal(err)
	}
	if rs, err := st.List(ctx, "a/once"); err != nil || len(rs) != 0 {
		t.Fatalf("List after Cancel: %v %+v", err, rs)
	}
}

// TestReminderOneShotIncarnationEndedOrRedelivered: a one-shot's fire is
// acknowledged only once its incarnation is ended; until then Get would
// report the reminder as still set although its schedule is gone and
// nothing fires it (an integration run under a cold compile found a
// delivered one-shot still stored 30 s later). Here the stream refuses the
// ending write (every write over its maximum message size, set during the first delivery): the
// fire is not acknowledged but retried after a back-off, its redelivery
// only ends the incarnation (delivered once), and once the stream takes
// the write, Get finds nothing.
func TestReminderOneShotIncarnationEndedOrRedelivered(t *testing.T) {
	t.Parallel()
	st := open(t)
	ctx := context.Background()
	// writes switches the stream's writes on and off: off, any message
	// is over its maximum size (message schedules keep rollups on).
	writes := func(on bool) {
		t.Helper()
		info, err := st.stream.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		cfg := info.Config
		cfg.MaxMsgSize = -1
		if !on {
			cfg.MaxMsgSize = 1
		}
		if _, err := st.js.UpdateStream(ctx, cfg); err != nil {
			t.Fatal(err)
		}
	}
	var first sync.Once
	rec := &recorder{fail: func(Fire) error {
		first.Do(func() { writes(false) })
		return nil
	}}
	var mu sync.Mutex
	var outcomes []Outcome
	run(t, st, rec, func(_ Fire, o Outcome, _ error) {
		mu.Lock()
		outcomes = append(outcomes, o)
		mu.Unlock()
	})
	if _, err := st.Set(ctx, Reminder{Address: "timer/e", Name: "wake", Schedule: In(500 * time.Millisecond), Type: "tick"}); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 15*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return slices.Contains(outcomes, Retried)
	}, "the fire whose incarnation could not be ended was not retried: outcomes %v", outcomesOf(&mu, &outcomes))
	mu.Lock()
	if slices.Contains(outcomes, Delivered) {
		t.Fatalf("outcomes %v: acknowledged as delivered with its incarnation current", outcomes)
	}
	mu.Unlock()
	if _, err := st.Get(ctx, "timer/e", "wake"); err != nil {
		t.Fatalf("Get with the fire not yet acknowledged: %v, want the reminder", err)
	}
	writes(true)
	natstest.Eventually(t, 15*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return slices.Contains(outcomes, Delivered)
	}, "the redelivered fire was not delivered")
	if _, err := st.Get(ctx, "timer/e", "wake"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get after the one-shot's incarnation ended: %v, want ErrNotFound", err)
	}
	// Delivered once: the redelivery to the same runner only ended the
	// incarnation (on another runner it would be delivered again under
	// its ID, for the hub's dedupe).
	if fires, _ := rec.snapshot(); len(fires) != 1 {
		t.Fatalf("fires %+v: want the one delivery", fires)
	}
}

type outcomeList struct {
	mu *sync.Mutex
	o  *[]Outcome
}

func (l outcomeList) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return fmt.Sprint(*l.o)
}

func outcomesOf(mu *sync.Mutex, o *[]Outcome) fmt.Stringer { return outcomeList{mu, o} }
