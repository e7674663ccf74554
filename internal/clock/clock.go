// Package clock is the time source of the sender, the hub and membership:
// every deadline, timer, ticker and sleep they keep goes through a Clock,
// so that a test can run them in virtual time on a fake one
// (github.com/jonboulle/clockwork's FakeClock) instead of sleeping (DESIGN
// §4, "Time is injectable"; issue 20, item 5).
//
// It is a package of its own, below hub, mesh and their subpackages, so
// that all of them can take the same clock without an import cycle: a node
// threads the one clock it was given (mesh.WithClock) to its client, its
// hub host, membership, the directory, the reminder runner and its sync
// streams.
//
// What stays on the real clock, and why, is said where it happens: a
// deadline handed to nats.go or to context.WithTimeout/WithDeadline bounds
// real network I/O (a context's deadline cannot run on a fake clock); a
// timestamp written to the wire or to a KV bucket is read by other
// processes; a latency measured for metrics measures real time.
package clock

import "github.com/jonboulle/clockwork"

// Clock is clockwork's clock: Now, Since, Until, Sleep, After, NewTimer,
// NewTicker and AfterFunc, with the semantics of package time's functions of
// those names (a Timer's Stop and Reset report as time.Timer's do; a
// Ticker's or Timer's channel is its Chan method). Implementations are safe
// for concurrent use.
type Clock = clockwork.Clock

// Timer is a Clock's timer (time.Timer's methods; its channel is Chan()).
type Timer = clockwork.Timer

// Ticker is a Clock's ticker (time.Ticker's methods; its channel is Chan()).
type Ticker = clockwork.Ticker

var realClock = clockwork.NewRealClock()

// Real returns the real clock: package time's functions. It is safe for
// concurrent use and shared.
func Real() Clock { return realClock }

// Or returns c, or the real clock if c is nil: a zero Clock in a
// configuration means the real one.
func Or(c Clock) Clock {
	if c == nil {
		return realClock
	}
	return c
}
