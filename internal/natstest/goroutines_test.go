package natstest

import (
	"strings"
	"testing"
	"time"
)

// TestSnapshotGoroutinesSeesALeak: a goroutine started after the snapshot
// and still blocked is reported by its creation site; once it ends, nothing
// is.
func TestSnapshotGoroutinesSeesALeak(t *testing.T) {
	before := SnapshotGoroutines()
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { <-stop; close(done) }()
	extra := SnapshotGoroutines().Extra(before)
	if len(extra) != 1 || !strings.Contains(extra[0], "TestSnapshotGoroutinesSeesALeak") {
		t.Fatalf("extra = %q, want the test's own goroutine", extra)
	}
	close(stop)
	<-done
	NoGoroutineLeak(t, before, 0, 5*time.Second)
}
