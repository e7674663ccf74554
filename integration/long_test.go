package integration

import (
	"os"
	"testing"
)

// The README's test command, go test -race ./..., runs the quick suite: it
// fits five minutes on a 2-core machine. The tests that take tens of
// seconds each (restarts of every server, lame-duck rolls, waits past a
// TTL, the nemesis's seeded schedule, a registry leader's election under
// traffic) run only with NATSMESH_LONG=1, which .ci/run sets: CI runs
// everything. Each guarantee they pin is also covered, in a shorter shape,
// by a test that runs in the quick suite (the cluster tests: a rolling
// restart, a server kill, a frozen owner, a link cut).
//
// The variable is read when a test asks (not in a package initializer), so
// that go test's cache records it: read at init, it was not, and a quick
// run's cached result answered a later NATSMESH_LONG=1 run — the long tests
// did not run at all.
func long() bool { return os.Getenv("NATSMESH_LONG") == "1" }

// longTest skips t unless NATSMESH_LONG=1.
func longTest(t *testing.T) {
	t.Helper()
	if !long() {
		t.Skipf("long test: run it with NATSMESH_LONG=1 go test -race -run '^%s$' ./integration (CI does)", t.Name())
	}
}
