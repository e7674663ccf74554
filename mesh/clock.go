package mesh

import (
	"context"
	"time"
)

// Clock is the time source of the retry ladder, injectable so tests run the
// ladder in virtual time (the habit of cenkalti/backoff's Clock).
// Implementations must be safe for concurrent use.
type Clock interface {
	Now() time.Time
	// Sleep blocks for d or until ctx ends, returning ctx.Err() then.
	Sleep(ctx context.Context, d time.Duration) error
}

// SystemClock is the real clock.
type SystemClock struct{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }

// Sleep waits d on a timer, or until ctx ends.
func (SystemClock) Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
