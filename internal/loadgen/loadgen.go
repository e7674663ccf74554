// Package loadgen runs a closed-loop load — N operations from C
// concurrent lanes — and measures it: throughput, nearest-rank latency
// percentiles and the verdict of every operation (verdict.Classify and
// the reason), with a progress bar on a terminal or a line a second
// elsewhere. It is meshctl bench's measurement (DESIGN §9: commands hold
// flags and wiring; behaviour lives in packages).
package loadgen

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/nats-io/nats.go"
	"github.com/schollz/progressbar/v3"

	"github.com/natsmesh/natsmesh/verdict"
)

// Spec says what Run runs.
type Spec struct {
	// Name labels the run in progress output ("mesh", "raw").
	Name string
	// N operations from C lanes (each lane runs N/C of them, one at a
	// time); C ≥ 1.
	N, C int
	// Size is the payload size, reported in the Result.
	Size int
	// Progress, if set, gets the progress output.
	Progress io.Writer
}

// Stop is a context cause that stops a run and says why (Result.Aborted):
// cancel the run's ctx with context.WithCancelCause(…)(&Stop{Why: …}).
type Stop struct{ Why string }

func (s *Stop) Error() string { return s.Why }

// Result is one run: its counts, rate, latency percentiles and verdicts.
type Result struct {
	Target         string  `json:"target"`
	Node           string  `json:"node,omitempty"`
	Deliveries     int     `json:"deliveries"`
	Concurrency    int     `json:"concurrency"`
	Size           int     `json:"size"`
	ElapsedSeconds float64 `json:"elapsed_seconds"`
	PerSecond      float64 `json:"per_second"`
	P50Ms          float64 `json:"p50_ms"`
	P90Ms          float64 `json:"p90_ms"`
	P99Ms          float64 `json:"p99_ms"`
	MaxMs          float64 `json:"max_ms"`
	// Verdicts counts the deliveries by verdict and reason:
	// "Accepted", "ShuttingDown/no-responders", "Failed/timeout", ...
	Verdicts map[string]int `json:"verdicts"`
	Timeouts int            `json:"timeouts"`
	// Unfinished deliveries were in flight when the run stopped: no
	// verdict, outcome unknown.
	Unfinished   int `json:"unfinished,omitempty"`
	PeakInFlight int `json:"peak_legs_in_flight,omitempty"`
	// Aborted says why the run stopped before all deliveries (too many
	// failures: the target is gone or refusing).
	Aborted string `json:"aborted,omitempty"`

	// Elapsed and the latency percentiles (nearest rank) as durations.
	Elapsed            time.Duration `json:"-"`
	P50, P90, P99, Max time.Duration `json:"-"`
}

// measure runs f.n calls of op over f.c lanes (each lane sequential, lanes
// concurrent) and summarises them.
// Run runs op N times from C goroutines (lane is 0..C-1) and measures
// each call. It blocks until all ran, ctx ended (calls cut short count as
// Unfinished, without a verdict), or a run of failures with no success
// among them — max(20, 2C) — shows the target gone or refusing (Aborted
// says so). An error from op is tallied by TallyKey. Safe to call
// concurrently (each call has its own state).
func Run(ctx context.Context, s Spec, op func(ctx context.Context, lane int) error) *Result {
	type laneResult struct {
		lat      []time.Duration
		verdicts map[string]int
		timeouts int
	}
	lanes := make([]laneResult, s.C)
	var done, accepted, failed, inARow, unfinished atomic.Int64
	// A run whose target went away would otherwise sit in the retry
	// ladder for every remaining delivery: stop after a run of failures
	// with no success among them.
	maxInARow := int64(max(20, 2*s.C))
	outer := ctx
	ctx, abort := context.WithCancel(ctx)
	defer abort()
	var aborted atomic.Bool
	stopBar := func() {}
	if s.Progress != nil {
		stopBar = progress(s.Progress, s.Name, s.N, &done, &accepted)
	}
	start := time.Now()
	var wg sync.WaitGroup
	for i := range lanes {
		count := s.N / s.C
		if i < s.N%s.C {
			count++
		}
		wg.Go(func() {
			lr := &lanes[i]
			lr.lat = make([]time.Duration, 0, count)
			lr.verdicts = map[string]int{}
			for range count {
				if ctx.Err() != nil {
					return
				}
				t0 := time.Now()
				err := op(ctx, i)
				if err != nil && ctx.Err() != nil {
					// Cut short by the stop (or Ctrl-C). A delivery the
					// stop found between attempts was given a verdict
					// already (e.g. refused ShuttingDown by a draining
					// target: nothing held): that is its outcome. Else it
					// had a leg out: no verdict, outcome unknown.
					last := VerdictBeforeStop(err)
					if last == nil {
						unfinished.Add(1)
						return
					}
					err = last
				}
				lr.lat = append(lr.lat, time.Since(t0))
				lr.verdicts[TallyKey(err)]++
				if IsTimeout(err) {
					lr.timeouts++
				}
				done.Add(1)
				if err == nil {
					accepted.Add(1)
				}
				if err == nil {
					inARow.Store(0)
				} else if failed.Add(1); inARow.Add(1) >= maxInARow && aborted.CompareAndSwap(false, true) {
					abort()
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	stopBar()

	r := &Result{Concurrency: s.C, Size: s.Size, Verdicts: map[string]int{}, Elapsed: elapsed}
	var stop *Stop
	switch {
	case errors.As(context.Cause(outer), &stop):
		r.Aborted = stop.Why
	case aborted.Load():
		r.Aborted = fmt.Sprintf("stopped after %d failures in a row (%d in all)", inARow.Load(), failed.Load())
	}
	r.Unfinished = int(unfinished.Load())
	var lat []time.Duration
	for _, lr := range lanes {
		lat = append(lat, lr.lat...)
		for k, v := range lr.verdicts {
			r.Verdicts[k] += v
		}
		r.Timeouts += lr.timeouts
	}
	r.Deliveries = len(lat)
	sort.Slice(lat, func(a, b int) bool { return lat[a] < lat[b] })
	r.P50, r.P90, r.P99 = Percentile(lat, 0.50), Percentile(lat, 0.90), Percentile(lat, 0.99)
	if len(lat) > 0 {
		r.Max = lat[len(lat)-1]
	}
	r.ElapsedSeconds = elapsed.Seconds()
	if elapsed > 0 {
		r.PerSecond = float64(r.Deliveries) / elapsed.Seconds()
	}
	toMs := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	r.P50Ms, r.P90Ms, r.P99Ms, r.MaxMs = toMs(r.P50), toMs(r.P90), toMs(r.P99), toMs(r.Max)
	return r
}

// TallyKey is the verdict and reason of a delivery's outcome, e.g.
// "Accepted", "Failed/timeout", "ShuttingDown/no-responders".
func TallyKey(err error) string {
	v := verdict.Classify(err).String()
	if err == nil {
		return v
	}
	switch r := verdict.ReasonOf(err); {
	case r != verdict.ReasonUnknown:
		return v + "/" + r.String()
	case IsTimeout(err):
		return v + "/timeout"
	case errors.Is(err, nats.ErrNoResponders):
		return v + "/no-responders"
	case errors.Is(err, nats.ErrDisconnected), errors.Is(err, nats.ErrConnectionClosed):
		return v + "/disconnected"
	case errors.Is(err, context.Canceled):
		return v + "/cancelled"
	}
	return v
}

// VerdictBeforeStop returns the verdict err carries besides the
// cancellation that cut its delivery short — the failure of an earlier
// attempt that a sender joined with the cancellation (errors.Join, as
// package mesh returns a delivery cancelled between attempts) — or nil when
// err holds nothing but the cancellation.
func VerdictBeforeStop(err error) error {
	for e := err; e != nil; e = errors.Unwrap(e) {
		j, ok := e.(interface{ Unwrap() []error })
		if !ok {
			continue
		}
		var rest []error
		for _, x := range j.Unwrap() {
			if x != nil && !errors.Is(x, context.Canceled) {
				rest = append(rest, x)
			}
		}
		if len(rest) == 0 {
			return nil
		}
		return errors.Join(rest...)
	}
	return nil
}

// IsTimeout reports whether err is a timeout (the callee may hold it).
func IsTimeout(err error) bool {
	return err != nil && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout))
}

// Percentile returns the nearest-rank p-quantile of sorted.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// Ratio is a/b, or 0 when b is 0.
func Ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// IsTerminal reports whether w is a terminal.
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && (isatty.IsTerminal(f.Fd()) || isatty.IsCygwinTerminal(f.Fd()))
}

// progress draws a bar of done/total on w when w is a terminal, else writes
// a progress line each second, until the returned stop is called.
func progress(w io.Writer, name string, total int, done, accepted *atomic.Int64) (stop func()) {
	if !IsTerminal(w) {
		return progressLines(w, name, total, done, accepted)
	}
	bar := progressbar.NewOptions(total,
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetDescription(name),
		progressbar.OptionShowCount(),
		progressbar.OptionShowIts(),
		progressbar.OptionSetItsString("deliveries"),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionClearOnFinish(),
		progressbar.OptionSetWidth(30),
		progressbar.OptionSetRenderBlankState(true),
	)
	quit := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				_ = bar.Set(int(done.Load()))
			case <-quit:
				_ = bar.Set(int(done.Load()))
				_ = bar.Finish()
				return
			}
		}
	}()
	return func() {
		close(quit)
		<-finished
	}
}

// progressLines writes "bench <name>: <done>/<total> deliveries, <n>
// accepted, <rate>/s" to w every second until stop is called.
func progressLines(w io.Writer, name string, total int, done, accepted *atomic.Int64) (stop func()) {
	quit := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		start, last, lastAt := time.Now(), int64(0), time.Now()
		for {
			select {
			case now := <-t.C:
				d := done.Load()
				rate := float64(d-last) / now.Sub(lastAt).Seconds()
				fmt.Fprintf(w, "bench %s: %d/%d deliveries, %d accepted, %.0f/s, %v\n", name, d, total, accepted.Load(), rate, now.Sub(start).Round(time.Second))
				last, lastAt = d, now
			case <-quit:
				return
			}
		}
	}()
	return func() {
		close(quit)
		<-finished
	}
}
