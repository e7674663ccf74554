package mesh

import "github.com/natsmesh/natsmesh/internal/clock"

// Clock is the time source a client and a node keep their timers on
// (github.com/jonboulle/clockwork's Clock; pass a clockwork.FakeClock to run
// them in virtual time): the retry ladder's back-offs and placement wait, a
// re-sent Request's wait for its owner to subscribe again, the ingress
// rate limits and a node's rejoin retries — and, on a node, its hub host's
// idle collection, membership's heartbeats and expiry, the directory's
// takeover waits and re-verification, the reminder runner's and its sync
// streams' timers (DESIGN §4, "Time is injectable"). Deadlines stay on the
// real clock: a caller's context's deadline, and the leg and request
// timeouts derived like it, bound real network I/O (a context's deadline
// cannot run on a fake clock). Implementations must be safe for concurrent
// use.
type Clock = clock.Clock
