package integration

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/mesh/reminders"
	"github.com/natsmesh/natsmesh/subjects"
)

// reminderLoad sets how many one-shots TestReminderLoad fires (0 skips it):
//
//	go test ./integration -run TestReminderLoad -reminders 10000
var reminderLoad = flag.Int("reminders", 0, "one-shot reminders TestReminderLoad fires at once across a 3-node mesh (0: skip)")

// TestReminderLoad (BENCHMARKS.md): -reminders one-shots due at the same
// instant on distinct addresses of a 3-node mesh on a 3-server cluster
// (R3 file storage), without and with a SIGKILL of one node half a second
// after the due time: every reminder's fire runs once; it reports fires
// per second (due time to last execution) and lateness percentiles (due
// time to each execution).
func TestReminderLoad(t *testing.T) {
	if *reminderLoad == 0 {
		t.Skip("-reminders not set")
	}
	for _, kill := range []bool{false, true} {
		t.Run(map[bool]string{false: "steady", true: "sigkill"}[kill], func(t *testing.T) {
			c := StartCluster(t, 3)
			c.WaitReady(t)
			nodes := startTestNodes(t, c.URL(), "l1", "l2", "l3")
			tc := reminderClient(t, c.URL())
			waitHosting(t, tc, "count", 3)
			execs := subscribeExecs(t, c.URL())
			st := reminderStore(t, c.URL())
			n := *reminderLoad
			due := time.Now().Add(time.Duration(n/1000+10) * time.Second)
			var wg sync.WaitGroup
			errs := make(chan error, n)
			sem := make(chan struct{}, 128)
			setStart := time.Now()
			for i := range n {
				wg.Add(1)
				sem <- struct{}{}
				go func() {
					defer func() { <-sem; wg.Done() }()
					_, err := st.Set(context.Background(), reminders.Reminder{Address: subjects.Address(fmt.Sprintf("count/l%d", i)), Name: "once", Schedule: reminders.At(due)})
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
			setTook := time.Since(setStart)
			if time.Now().After(due) {
				t.Fatalf("setting %d reminders took %v, past their due time", n, setTook)
			}
			if kill {
				for time.Now().Before(due.Add(500 * time.Millisecond)) {
					time.Sleep(10 * time.Millisecond)
				}
				if err := nodes["l2"].Signal(syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
			}
			natstest.Eventually(t, 5*time.Minute, func() bool {
				execs.mu.Lock()
				defer execs.mu.Unlock()
				got := 0
				for _, m := range execs.events {
					if m.Header.Get("Test-Reminder") != "" {
						got++
					}
				}
				return got >= n
			}, "not every reminder fired")
			execs.mu.Lock()
			defer execs.mu.Unlock()
			perID := map[string]int{}
			var late []time.Duration
			var last time.Time
			for _, m := range execs.events {
				if m.Header.Get("Test-Reminder") == "" {
					continue
				}
				perID[m.Header.Get("Mesh-Id")]++
				ns, _ := strconv.ParseInt(m.Header.Get("Test-At"), 10, 64)
				at := time.Unix(0, ns)
				late = append(late, at.Sub(due))
				if at.After(last) {
					last = at
				}
			}
			dup := 0
			for _, c := range perID {
				if c > 1 {
					dup++
				}
			}
			slices.Sort(late)
			t.Logf("%d reminders (set in %v): %d fires, %d distinct, %d run more than once; all within %v of the due time: %.0f fires/s; lateness p50 %v p99 %v max %v",
				n, setTook.Round(time.Millisecond), len(late), len(perID), dup, last.Sub(due).Round(time.Millisecond),
				float64(n)/last.Sub(due).Seconds(), late[len(late)/2].Round(time.Millisecond), late[len(late)*99/100].Round(time.Millisecond), late[len(late)-1].Round(time.Millisecond))
			if len(perID) != n {
				t.Fatalf("%d distinct fires for %d reminders", len(perID), n)
			}
			if dup > 0 && !kill {
				t.Fatalf("%d fires ran twice without a fault", dup)
			}
		})
	}
}
