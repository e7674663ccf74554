package reminders

// Hostile tests (round 3, session 3, second pass) of the conditional
// incarnation writes.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/verdict"
)

// Many one-shots all due at one instant are replaced (each Set B on a
// second connection returning nil) right around that instant. Each Set B
// that returned nil must be what Get shows, and it must fire. The server
// produces a one-shot's fire from the schedule message it read and, when
// it stores the fire, purges the whole schedule subject (Nats-Schedule-Next:
// purge) — a Set B stored between the two is purged with it.
func TestReminderPurgeRaceSetAtDueInstantPurgedWithReplacedFire(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	ctx := context.Background()
	st1, err := Open(ctx, Config{Conn: natstest.Connect(t, s)})
	if err != nil {
		t.Fatal(err)
	}
	st2, err := Open(ctx, Config{Conn: natstest.Connect(t, s)})
	if err != nil {
		t.Fatal(err)
	}
	b := &byName{}
	r, err := st1.Run(ctx, RunConfig{Deliver: b.deliver, RetryBase: 100 * time.Millisecond, RetryMax: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
	const names = 400
	const addr = "timer/due"
	payload := make([]byte, 8<<10) // slower fire processing: a wider window
	due := time.Now().Add(1500 * time.Millisecond)
	for i := range names {
		if _, err := st1.Set(ctx, Reminder{Address: addr, Name: fmt.Sprintf("n%d", i), Schedule: At(due), Payload: append([]byte("a"), payload...)}); err != nil {
			t.Fatal(err)
		}
	}
	dueB := due.Add(4 * time.Second)
	var mu sync.Mutex
	okB := map[string]bool{}
	var wg sync.WaitGroup
	for i := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Until(due.Add(-20*time.Millisecond + time.Duration(i%100)*3*time.Millisecond)))
			name := fmt.Sprintf("n%d", i)
			_, err := st2.Set(ctx, Reminder{Address: addr, Name: name, Schedule: At(dueB), Payload: []byte("b")})
			if err != nil && !errors.Is(err, ErrConcurrent) {
				t.Error(err)
			}
			if err == nil {
				mu.Lock()
				okB[name] = true
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	// Let every fire of A be produced and handled.
	natstest.Eventually(t, 10*time.Second, func() bool { f, _ := pending(t, st1); return time.Now().After(due.Add(time.Second)) && f == 0 }, "A fires remain")
	var hidden []string
	states := map[string]state{}
	for name := range okB {
		states[name] = readState(t, st1, addr, name)
		g, err := st1.Get(ctx, addr, name)
		if time.Now().After(dueB.Add(-100 * time.Millisecond)) {
			// Read at or past B's own due time (a loaded machine: the
			// wait for A's fires ran long): B may have fired and gone
			// meanwhile, so Get tells nothing; that B fired is checked
			// below. (A cold go test -race ./... read 362 of 400 after
			// dueB and failed here although every B fired.)
			continue
		}
		if err != nil || string(g.Payload) != "b" {
			hidden = append(hidden, fmt.Sprintf("%s: Get = %q, %v (schedule %s, incarnation subject %s)", name, g.Payload, err, states[name].sched, states[name].inc))
		}
	}
	natstest.Eventually(t, 15*time.Second, func() bool {
		return time.Now().After(dueB) && settled(t, st1)
	}, "fires or schedules remain")
	var lost []string
	for name := range okB {
		if b.get(name)["b"] == 0 {
			lost = append(lost, fmt.Sprintf("%s (schedule %s, incarnation subject %s)", name, states[name].sched, states[name].inc))
		}
	}
	// Every reminder was delivered (or should have been): nothing of
	// them may stay in the stream forever.
	forever := 0
	info, err := st1.stream.Info(ctx, jetstream.WithSubjectFilter(st1.base+">"))
	if err != nil {
		t.Fatal(err)
	}
	for subj := range info.State.Subjects {
		if m, err := st1.last(ctx, subj); err != nil {
			t.Fatal(err)
		} else if m != nil && m.Header.Get(natsTTL) == "" {
			forever++
		}
	}
	if len(hidden) > 0 || len(lost) > 0 || forever > 0 {
		t.Fatalf("of %d Set B returning nil around the due instant of the one-shot they replaced: %d not shown by Get: %s; %d never fired: %s; %d subjects kept forever",
			len(okB), len(hidden), strings.Join(hidden, "; "), len(lost), strings.Join(lost, "; "), forever)
	}
}

// A cron expression of six fields whose values the server refuses (the
// client checks only the shape: "the fields' values are left to the
// server"). Set's contract: an invalid reminder fails with
// ErrInvalidReminder and nothing is written; nothing stays in the stream
// forever; a failed Set leaves the reminder it would have replaced.
func TestReminderPurgeRaceServerRefusedCronLeavesIncarnationForever(t *testing.T) {
	t.Parallel()
	st := open(t)
	ctx := context.Background()
	const addr = "timer/cron"
	_, err := st.Set(ctx, Reminder{Address: addr, Name: "fresh", Schedule: Cron("99 * * * * *", "")})
	if err == nil {
		t.Fatal("the server took cron 99 * * * * *")
	}
	var problems []string
	if !errors.Is(err, ErrInvalidReminder) {
		problems = append(problems, fmt.Sprintf("Set of cron \"99 * * * * *\" = %v; want ErrInvalidReminder", err))
	}
	if m, err := st.last(ctx, st.subject("i", addr, "fresh")); err != nil {
		t.Fatal(err)
	} else if m != nil && m.Header.Get(natsTTL) == "" {
		problems = append(problems, fmt.Sprintf("the refused Set left %s with no TTL (kept forever; List shows nothing): headers %v", m.Subject, m.Header))
	}
	// A one-shot whose fire waits (no runner yet), then a refused Set of
	// the same name: the one-shot should still be there and fire.
	if _, err := st.Set(ctx, Reminder{Address: addr, Name: "wake", Schedule: At(time.Now().Add(100 * time.Millisecond)), Payload: []byte("a")}); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 10*time.Second, func() bool { f, _ := pending(t, st); return f == 1 }, "the one-shot did not fire")
	if _, err := st.Set(ctx, Reminder{Address: addr, Name: "wake", Schedule: Cron("0 0 25 * * *", "")}); err == nil {
		t.Fatal("the server took cron 0 0 25 * * *")
	}
	if g, err := st.Get(ctx, addr, "wake"); err != nil {
		problems = append(problems, fmt.Sprintf("after a refused Set, Get of the waiting one-shot = %v", err))
	} else if string(g.Payload) != "a" {
		problems = append(problems, fmt.Sprintf("after a refused Set, Get = %+v", g))
	}
	oc := &outcomes{}
	run(t, st, &recorder{}, oc.record)
	natstest.Eventually(t, 10*time.Second, func() bool { return oc.get("a", Delivered)+oc.get("a", Dropped) == 1 }, "the fire was not handled")
	if oc.get("a", Delivered) == 0 {
		problems = append(problems, "the waiting one-shot's fire was dropped after a refused Set")
	}
	if len(problems) > 0 {
		t.Fatal(strings.Join(problems, "\n"))
	}
}

// "Fire now" twice: two back-to-back Sets of a one-shot due in the past
// (it fires at once), on many names at once. The second Set returned nil
// after the first, so it is the reminder, and it must fire.
func TestReminderPurgeRaceBackToBackPastDueSetsSecondNeverFires(t *testing.T) {
	t.Parallel()
	st := open(t)
	ctx := context.Background()
	b := &byName{}
	r, err := st.Run(ctx, RunConfig{Deliver: b.deliver, RetryBase: 100 * time.Millisecond, RetryMax: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
	const names = 300
	const addr = "timer/now"
	var mu sync.Mutex
	okB := map[string]bool{}
	var wg sync.WaitGroup
	for i := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := fmt.Sprintf("n%d", i)
			if _, err := st.Set(ctx, Reminder{Address: addr, Name: name, Schedule: At(time.Now().Add(-time.Second)), Payload: []byte("a")}); err != nil {
				t.Error(err)
				return
			}
			// Past the server's next scheduling tick for some names.
			time.Sleep(time.Duration(i%50) * 5 * time.Millisecond)
			if _, err := st.Set(ctx, Reminder{Address: addr, Name: name, Schedule: At(time.Now().Add(-time.Second)), Payload: []byte("b")}); err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			okB[name] = true
			mu.Unlock()
		}()
	}
	wg.Wait()
	natstest.Eventually(t, 15*time.Second, func() bool { return settled(t, st) }, "fires or schedules remain")
	var lost []string
	for name := range okB {
		if b.get(name)["b"] == 0 {
			g, err := st.Get(ctx, addr, name)
			lost = append(lost, fmt.Sprintf("%s (delivered %v; Get = %q, %v)", name, b.get(name), g.Payload, err))
		}
	}
	if len(lost) > 0 {
		t.Fatalf("%d of %d second Sets (returned nil) of a past-due one-shot never fired: %s", len(lost), len(okB), strings.Join(lost, "; "))
	}
}

// Many one-shots due at one instant are cancelled right around it on a
// second connection: no fire may be handed to the deliverer well after
// its Cancel returned nil, Get must say ErrNotFound after it, and nothing
// may be left without a TTL.
func TestReminderPurgeRaceCancelAtDueInstant(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	ctx := context.Background()
	st1, err := Open(ctx, Config{Conn: natstest.Connect(t, s)})
	if err != nil {
		t.Fatal(err)
	}
	st2, err := Open(ctx, Config{Conn: natstest.Connect(t, s)})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	cancelled := map[string]time.Time{}
	var late []string
	deliver := func(_ context.Context, f Fire) error {
		now := time.Now()
		mu.Lock()
		defer mu.Unlock()
		if at, ok := cancelled[f.Name]; ok && now.Sub(at) > 300*time.Millisecond {
			late = append(late, fmt.Sprintf("%s %v after Cancel", f.Name, now.Sub(at)))
		}
		return nil
	}
	r, err := st1.Run(ctx, RunConfig{Deliver: deliver, RetryBase: 100 * time.Millisecond, RetryMax: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
	const names = 400
	const addr = "timer/cdue"
	due := time.Now().Add(1500 * time.Millisecond)
	for i := range names {
		if _, err := st1.Set(ctx, Reminder{Address: addr, Name: fmt.Sprintf("n%d", i), Schedule: At(due), Payload: make([]byte, 8<<10)}); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	var shown []string
	for i := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Until(due.Add(-20*time.Millisecond + time.Duration(i%100)*3*time.Millisecond)))
			name := fmt.Sprintf("n%d", i)
			err := st2.Cancel(ctx, addr, name)
			if err != nil && !errors.Is(err, ErrNotFound) {
				t.Error(err)
				return
			}
			if err == nil {
				mu.Lock()
				cancelled[name] = time.Now()
				mu.Unlock()
			}
			if g, err := st1.Get(ctx, addr, name); !errors.Is(err, ErrNotFound) {
				mu.Lock()
				shown = append(shown, fmt.Sprintf("%s: %+v, %v", name, g.Pending, err))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	natstest.Eventually(t, 10*time.Second, func() bool { f, _ := pending(t, st1); return f == 0 }, "fires remain")
	info, err := st1.stream.Info(ctx, jetstream.WithSubjectFilter(st1.base+">"))
	if err != nil {
		t.Fatal(err)
	}
	forever := 0
	for subj := range info.State.Subjects {
		if m, err := st1.last(ctx, subj); err != nil {
			t.Fatal(err)
		} else if m != nil && m.Header.Get(natsTTL) == "" {
			forever++
		}
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d cancelled", len(cancelled))
	if len(late) > 0 || len(shown) > 0 || forever > 0 {
		t.Fatalf("%d delivered after Cancel: %v; %d shown after Cancel/NotFound: %v; %d subjects kept forever", len(late), late, len(shown), shown, forever)
	}
}

// Reminders that only have a failure record (a one-shot failed for good)
// are cancelled while a Set replaces them, on two connections. Whatever
// each returned, the outcome must agree: a Set that returned nil while
// its Cancel did not is what Get shows and fires; a Set that lost
// (ErrConcurrent) left nothing; both cannot lose.
func TestReminderPurgeRaceCancelFailureOnlyRacingSet(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	ctx := context.Background()
	st1, err := Open(ctx, Config{Conn: natstest.Connect(t, s)})
	if err != nil {
		t.Fatal(err)
	}
	st2, err := Open(ctx, Config{Conn: natstest.Connect(t, s)})
	if err != nil {
		t.Fatal(err)
	}
	b := &byName{}
	oc := &outcomes{}
	r, err := st1.Run(ctx, RunConfig{Deliver: func(ctx context.Context, f Fire) error {
		if string(f.Payload) == "a" {
			return fmt.Errorf("for good: %w", verdict.ErrHandler)
		}
		return b.deliver(ctx, f)
	}, RetryBase: 100 * time.Millisecond, RetryMax: 200 * time.Millisecond, OnOutcome: oc.record})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
	const names = 200
	const addr = "timer/xrace"
	for i := range names {
		if _, err := st1.Set(ctx, Reminder{Address: addr, Name: fmt.Sprintf("n%d", i), Schedule: At(time.Now().Add(100 * time.Millisecond)), Payload: []byte("a")}); err != nil {
			t.Fatal(err)
		}
	}
	natstest.Eventually(t, 15*time.Second, func() bool { return oc.get("a", Failed) == names }, "not all failed: %v", lazyOutcomes(oc))
	natstest.Eventually(t, 5*time.Second, func() bool {
		g, err := st1.Get(ctx, addr, fmt.Sprintf("n%d", names-1))
		return err == nil && g.LastFailure != nil
	}, "no failure record")
	for i := range names {
		name := fmt.Sprintf("n%d", i)
		g, err := st2.Get(ctx, addr, name)
		if err != nil || g.LastFailure == nil {
			t.Fatalf("before the race, Get %s (a one-shot failed for good) = %+v, %v (state %+v)", name, g, err, readState(t, st2, addr, name))
		}
	}
	dueB := time.Now().Add(3 * time.Second)
	setErr := make([]error, names)
	cancelErr := make([]error, names)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range names {
		name := fmt.Sprintf("n%d", i)
		wg.Add(2)
		go func() {
			defer wg.Done()
			<-start
			cancelErr[i] = st2.Cancel(ctx, addr, name)
		}()
		go func() {
			defer wg.Done()
			<-start
			time.Sleep(time.Duration(i%100) * 2 * time.Millisecond)
			_, setErr[i] = st1.Set(ctx, Reminder{Address: addr, Name: name, Schedule: At(dueB), Payload: []byte("b")})
		}()
	}
	close(start)
	wg.Wait()
	var bad []string
	shown := map[string]bool{}
	late := map[string]bool{}
	counts := map[string]int{}
	for i := range names {
		name := fmt.Sprintf("n%d", i)
		se, ce := setErr[i], cancelErr[i]
		if se != nil && !errors.Is(se, ErrConcurrent) || ce != nil && !errors.Is(ce, ErrConcurrent) && !errors.Is(ce, ErrNotFound) {
			t.Fatalf("%s: Set %v, Cancel %v", name, se, ce)
		}
		counts[fmt.Sprintf("set=%v cancel=%v notfound=%v", se == nil, ce == nil, errors.Is(ce, ErrNotFound))]++
		g, gerr := st1.Get(ctx, addr, name)
		if gerr != nil && !errors.Is(gerr, ErrNotFound) {
			t.Fatal(gerr)
		}
		if errors.Is(gerr, ErrNotFound) && time.Now().After(dueB.Add(-100*time.Millisecond)) {
			// Read at or past B's due time (a loaded machine ran the
			// races long): B may have fired and gone, so Get tells
			// nothing; whether B fired is checked below from the
			// errors alone.
			late[name] = true
			continue
		}
		isB := gerr == nil && string(g.Payload) == "b"
		if gerr == nil && !isB {
			bad = append(bad, fmt.Sprintf("%s: Get shows %q (LastFailure %v) after Set %v / Cancel %v", name, g.Payload, g.LastFailure, se, ce))
		}
		if isB && g.LastFailure != nil {
			bad = append(bad, fmt.Sprintf("%s: Get shows the new Set with the old failure %+v", name, *g.LastFailure))
		}
		switch {
		case se != nil && ce != nil:
			bad = append(bad, fmt.Sprintf("%s: both lost: Set %v, Cancel %v", name, se, ce))
		case se == nil && ce != nil && !isB:
			bad = append(bad, fmt.Sprintf("%s: Set won (Cancel %v) but Get = %v", name, ce, gerr))
		case se != nil && isB:
			bad = append(bad, fmt.Sprintf("%s: Set lost (%v) but Get shows it", name, se))
		}
		shown[name] = isB
	}
	natstest.Eventually(t, 15*time.Second, func() bool { return time.Now().After(dueB) && settled(t, st1) }, "fires remain")
	for i := range names {
		name := fmt.Sprintf("n%d", i)
		n := b.get(name)["b"]
		if late[name] {
			// Only what the errors decide: a Set refused never fires,
			// a Set that won over a refused Cancel does.
			se, ce := setErr[i], cancelErr[i]
			if se != nil && n > 0 || se == nil && ce != nil && n == 0 {
				bad = append(bad, fmt.Sprintf("%s: read late, delivered %d (Set %v, Cancel %v)", name, n, se, ce))
			}
			continue
		}
		if shown[name] != (n > 0) {
			bad = append(bad, fmt.Sprintf("%s: shown %v, delivered %d (Set %v, Cancel %v)", name, shown[name], n, setErr[i], cancelErr[i]))
		}
	}
	t.Logf("outcomes: %v", counts)
	if len(bad) > 0 {
		t.Fatalf("%d inconsistencies: %s", len(bad), strings.Join(bad, "; "))
	}
}
