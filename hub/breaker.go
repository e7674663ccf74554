package hub

import (
	"sync"
	"time"

	"github.com/natsmesh/natsmesh/subjects"
)

// DefaultBreakerRate is the storm breaker's default limit: deliveries per
// second per (sender, target, type, stream) key (DESIGN §5), counted over
// the legs that do not continue a windowed lane (no HeaderLane, or the
// first of an epoch).
//
// What the breaker is for is a sender that does not wait for its verdicts:
// a client without lanes pipelining or looping as fast as it can (the
// seeds' resubscribe storms). A one-leg-at-a-time sender — `nats req`, a
// sequential mesh caller, whose legs carry no HeaderLane — carries at most
// one delivery per round trip on a key: about 18 000/s in process on the CI
// machine, less over any real network; the default sits above that, so
// ordinary traffic never trips it. A lower default would refuse, as
// Ignored, a plain sequential sender: at 1 000/s, BenchmarkSequential and
// `meshctl bench -c 1` fail within their first second.
//
// A windowed lane (DESIGN §4) is a mesh sender's pipelining by design: up
// to W legs per round trip, each sequence-checked by the intake (a re-sent
// leg is refused out of order or answered from the dedupe window, never
// handled again), so its rate is the throughput the window exists to give —
// one pipelined lane did about 19 000–35 000/s on a loaded 2-core machine,
// and more on a quiet or larger one. Counted, it would trip the default on
// a fast machine and refuse a healthy lane Ignored (terminal), so a lane's
// legs after the first of its epoch are not counted. The first of each
// epoch is: a client stamping every leg as a new epoch's first counts as
// one that gives none, and a leg out of sequence is refused out-of-order
// before anything of it is handled. The refusal is cheap — no activation, no inbox
// slot — so a flood cannot take more than the rate's share of the
// address's inbox from other keys. A deployment that knows its traffic sets
// Config.BreakerRate lower to catch slower storms.
const DefaultBreakerRate = 50_000

// breakerKeep is the number of keys up to which a window's map is cleared
// and reused for the next window; a larger one is dropped and replaced, so a
// burst of many keys is not kept in memory after its second.
const breakerKeep = 1024

// breakerKey is what the storm breaker counts by: a comparable struct, never
// a joined string. Sender is Delivery.Sender ("name.gen" of a mesh sender,
// from Mesh-Sender or the answer subject); a client that gives neither has
// Sender "", so all such clients share one key per target, type and stream.
// Stream is read through subjects.StreamIdentity, as the sender's lane key
// is.
type breakerKey struct {
	Sender string
	Target subjects.Address
	Type   string
	Stream subjects.Stream
}

// keyOf returns the breaker key of a parsed delivery.
func keyOf(d *Delivery) breakerKey {
	return breakerKey{Sender: d.Sender, Target: d.To, Type: d.Type, Stream: subjects.StreamIdentity(d.Stream)}
}

// breaker is the storm breaker: a fixed one-second window of counters per
// key. Each key may pass rate deliveries per window; the rest of its window
// is refused. When the clock enters a new window every counter starts from
// zero at once: the map is cleared (or replaced, see breakerKeep), so a key
// idle for one window costs nothing and memory holds at most the keys seen
// in the current second.
//
// A fixed window rather than a token bucket: it is the per-second counter of
// DESIGN §5, one integer per key with no per-key timestamp or refill
// arithmetic, and its whole state is dropped at once, which is what bounds
// memory without a sweep. Its known weakness — up to twice the rate across
// a window boundary — does not matter for a breaker, whose limit is meant to
// sit far above legitimate traffic rather than to shape it.
//
// Memory: only the current window's keys are held — at most one entry per
// distinct key seen in the last second (four string headers and a count,
// about 100 bytes with map overhead; the strings are the delivery's own),
// plus, between bursts, the buckets of a reused map of at most breakerKeep
// keys.
//
// allow is called on the intake goroutine. It takes one uncontended mutex,
// reads the clock, and allocates only when a new key enters the map. Safe
// for concurrent use.
type breaker struct {
	rate  int
	now   func() time.Time // injectable for tests
	epoch time.Time        // windows are whole seconds since epoch

	mu     sync.Mutex
	window int64 // index of the current window
	counts map[breakerKey]int
}

func newBreaker(rate int, now func() time.Time) *breaker {
	return &breaker{rate: rate, now: now, epoch: now(), counts: make(map[breakerKey]int)}
}

// allow counts one delivery of k in the current window and reports whether
// it is within the rate. tripped is true for the first refusal of k in a
// window only, so the caller can log a storm once per key per second.
func (b *breaker) allow(k breakerKey) (ok, tripped bool) {
	w := int64(b.now().Sub(b.epoch) / time.Second)
	b.mu.Lock()
	defer b.mu.Unlock()
	if w != b.window {
		b.window = w
		if len(b.counts) > breakerKeep {
			b.counts = make(map[breakerKey]int)
		} else {
			clear(b.counts)
		}
	}
	n := b.counts[k]
	switch {
	case n < b.rate:
		b.counts[k] = n + 1
		return true, false
	case n == b.rate:
		b.counts[k] = n + 1 // marks the key tripped for this window
		return false, true
	default:
		return false, false
	}
}
