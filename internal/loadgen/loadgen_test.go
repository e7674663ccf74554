package loadgen

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/verdict"
)

// Run splits N over C lanes, tallies every outcome by verdict and reason,
// and orders the percentiles.
func TestRunCountsEveryOperation(t *testing.T) {
	var calls atomic.Int64
	lanes := make([]atomic.Int64, 3)
	r := Run(context.Background(), Spec{Name: "t", N: 10, C: 3, Size: 8}, func(_ context.Context, lane int) error {
		lanes[lane].Add(1)
		if calls.Add(1)%5 == 0 {
			return nats.ErrTimeout
		}
		return nil
	})
	if r.Deliveries != 10 || r.Concurrency != 3 || r.Size != 8 || r.Unfinished != 0 || r.Aborted != "" {
		t.Fatalf("result %+v", r)
	}
	if got := lanes[0].Load() + lanes[1].Load() + lanes[2].Load(); got != 10 || lanes[0].Load() != 4 {
		t.Fatalf("lanes ran %d, %d, %d", lanes[0].Load(), lanes[1].Load(), lanes[2].Load())
	}
	if r.Verdicts["Accepted"] != 8 || r.Verdicts["Failed/timeout"] != 2 || r.Timeouts != 2 {
		t.Fatalf("verdicts %v, timeouts %d", r.Verdicts, r.Timeouts)
	}
	if !(r.P50 <= r.P90 && r.P90 <= r.P99 && r.P99 <= r.Max) {
		t.Fatalf("percentiles out of order: %v %v %v %v", r.P50, r.P90, r.P99, r.Max)
	}
}

// A run of failures with no success stops the run, and a Stop cause on
// the ctx names why.
func TestRunStops(t *testing.T) {
	refused := verdict.New(verdict.ReasonHubShuttingDown, "draining")
	r := Run(context.Background(), Spec{N: 1000, C: 2}, func(context.Context, int) error { return refused })
	if r.Deliveries >= 1000 || !strings.Contains(r.Aborted, "failures in a row") || r.Verdicts["ShuttingDown/shutting-down"] == 0 {
		t.Fatalf("not stopped by failures: %+v", r)
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	n := 0
	r = Run(ctx, Spec{N: 1000, C: 1}, func(context.Context, int) error {
		if n++; n == 5 {
			cancel(&Stop{Why: "target gone"})
		}
		return nil
	})
	if r.Aborted != "target gone" || r.Deliveries >= 1000 {
		t.Fatalf("not stopped by its cause: %+v", r)
	}
}

// A delivery cut short by the stop between attempts keeps the verdict its
// earlier attempt got (a draining target's ShuttingDown refusal: nothing
// held); one cut short with nothing but the cancellation is unfinished
// (outcome unknown). Found by a new user: a bench whose target drained
// called its refused deliveries "outcome unknown".
func TestRunStopKeepsEarlierVerdict(t *testing.T) {
	refused := verdict.New(verdict.ReasonHubShuttingDown, "draining")
	for _, tc := range []struct {
		name       string
		err        func(ctx context.Context) error
		unfinished int
		tally      string
	}{
		{"refused, then stopped in its back-off", func(ctx context.Context) error {
			return fmt.Errorf("mesh: deliver d1: %w", errors.Join(fmt.Errorf("cancelled while backing off: %w", context.Cause(ctx)), context.Canceled, refused))
		}, 0, "ShuttingDown/shutting-down"},
		{"a leg out when stopped", func(ctx context.Context) error {
			return fmt.Errorf("mesh: deliver d1: %w", context.Canceled)
		}, 1, ""},
		{"only cancellations joined", func(ctx context.Context) error {
			return errors.Join(context.Canceled, fmt.Errorf("x: %w", context.Canceled))
		}, 1, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancelCause(context.Background())
			r := Run(ctx, Spec{N: 10, C: 1}, func(ctx context.Context, _ int) error {
				cancel(&Stop{Why: "target gone"})
				return tc.err(ctx)
			})
			if r.Unfinished != tc.unfinished {
				t.Errorf("unfinished %d, want %d: %+v", r.Unfinished, tc.unfinished, r)
			}
			if tc.tally != "" && (r.Verdicts[tc.tally] != 1 || r.Deliveries != 1) {
				t.Errorf("verdicts %v (%d deliveries), want one %s", r.Verdicts, r.Deliveries, tc.tally)
			}
			if r.Aborted != "target gone" {
				t.Errorf("aborted %q", r.Aborted)
			}
		})
	}
}
