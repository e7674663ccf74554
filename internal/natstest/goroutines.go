package natstest

import (
	"fmt"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"
)

// Goroutines is a snapshot of the process's goroutines outside the
// in-process NATS servers, counted by where each was created (the
// "created by" frame of its stack). A server's own goroutines (per
// connection, per JetStream consumer, its timers) come and go on the
// server's schedule, not the code under test's, so counting them makes a
// leak check fail on a busy machine without any leak.
type Goroutines map[string]int

// serverFrame marks a goroutine that belongs to an in-process nats-server.
const serverFrame = "github.com/nats-io/nats-server/v2/"

// SnapshotGoroutines returns the process's goroutines outside any
// in-process nats-server, by creation site.
func SnapshotGoroutines() Goroutines {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	g := Goroutines{}
	for _, stack := range strings.Split(string(buf), "\n\n") {
		if stack == "" || strings.Contains(stack, serverFrame) {
			continue
		}
		site := "(main)"
		if i := strings.Index(stack, "\ncreated by "); i >= 0 {
			site = stack[i+len("\ncreated by "):]
			if j := strings.Index(site, " in goroutine"); j >= 0 {
				site = site[:j]
			}
			if j := strings.IndexByte(site, '\n'); j >= 0 {
				site = site[:j]
			}
		}
		g[site]++
	}
	return g
}

// Extra lists the creation sites that have more goroutines in g than in
// before, with their counts ("site: before -> now"), sorted; empty when g
// holds nothing before did not.
func (g Goroutines) Extra(before Goroutines) []string {
	var out []string
	for site, n := range g {
		if n > before[site] {
			out = append(out, fmt.Sprintf("%s: %d -> %d", site, before[site], n))
		}
	}
	sort.Strings(out)
	return out
}

// NoGoroutineLeak polls for up to timeout until no creation site has more
// goroutines outside the NATS servers than it had in before, allowing
// slack extra goroutines in all; it fails the test naming the sites that
// kept more.
func NoGoroutineLeak(t testing.TB, before Goroutines, slack int, timeout time.Duration) {
	t.Helper()
	var extra []string
	ok := Poll(timeout, func() bool {
		now := SnapshotGoroutines()
		extra = now.Extra(before)
		n := 0
		for site, c := range now {
			if d := c - before[site]; d > 0 {
				n += d
			}
		}
		return n <= slack
	})
	if !ok {
		t.Fatalf("natstest: goroutines left after %v (beyond a slack of %d):\n%s", timeout, slack, strings.Join(extra, "\n"))
	}
}
