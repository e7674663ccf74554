package hub

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// Hub is the receiver for one address on one node. Handle is called for one
// delivery at a time, in acceptance order (actor semantics), never
// concurrently for the same activation — except where the hub opts in:
// deliveries of the types a ReadOnly hub names run side by side with each
// other (never beside an exclusive turn), and a Reentrant hub's turn may be
// entered again by a request of its own call chain. ctx is cancelled when the host
// closes. An error returned for a request is sent to the requester as a
// Failed verdict (verdict.ErrHandler); for a plain delivery it is logged.
type Hub interface {
	Handle(ctx context.Context, d *Delivery) error
}

// Deactivator is implemented by hubs that want to release resources when
// their activation is idle-collected or the host closes. It runs once, after
// the last Handle call returned. Deactivate of different activations may
// run at the same time (an idle collection deactivates up to 32 at once).
type Deactivator interface {
	Deactivate(ctx context.Context)
}

// Pinner is implemented by hubs that must not be idle-collected while they
// hold something only they can serve (for instance sync-stream
// subscribers). Pinned is called on the collector's goroutine, once the
// activation has been idle for the idle timeout; one found pinned is asked
// again an idle timeout later (so one unpinned is collected within about
// two idle timeouts of its last use).
type Pinner interface {
	Pinned() bool
}

// MaxBatch is the most deliveries a [Batcher] receives in one turn.
const MaxBatch = 64

// Batcher is implemented by hubs that handle several queued deliveries in
// one turn — for instance to persist their changes with one [State.Save]
// instead of one per delivery (a hot stateful address is otherwise bounded
// by one save round trip per delivery). When more than one delivery is
// queued, HandleBatch receives up to MaxBatch of them in acceptance order;
// a lone delivery goes to Handle. Turns stay one at a time. A delivery the
// hub did not respond to gets an empty response, or HandleBatch's error
// (as Handle's error does for one delivery).
type Batcher interface {
	Hub
	HandleBatch(ctx context.Context, ds []*Delivery) error
}

// Factory builds the hub for addr. It runs on its own goroutine and may take
// as long as it needs (deliveries arriving meanwhile are accepted and parked);
// ctx is cancelled when the host closes. An error fails every parked delivery
// once, late, with Unavailable (verdict.ErrActivationFailed).
type Factory func(ctx context.Context, addr subjects.Address) (Hub, error)

// HandlerFunc adapts a function to a Hub.
type HandlerFunc func(ctx context.Context, d *Delivery) error

// Handle calls f.
func (f HandlerFunc) Handle(ctx context.Context, d *Delivery) error { return f(ctx, d) }

// Delivery is one accepted delivery as a hub sees it. Its fields are
// read-only; Payload is owned by the hub once Handle is called.
type Delivery struct {
	ID      string
	From    subjects.Address // sending address, if the sender gave one
	To      subjects.Address
	Stream  subjects.Stream
	Type    string
	Payload []byte
	Attempt int    // 1-based attempt that was accepted
	Sender  string // sending node or client "name.gen", if given
	// Caller is the outside caller the ingress forwarded the delivery
	// for (HeaderCaller: "acc:<account>/<user>" or "inbox:<prefix>"), or
	// empty for a node's own sender. Established by the ingress node from
	// what the NATS server tells it, never from the client's message.
	Caller string
	// Reminder is the name of the reminder this delivery is a fire of
	// (HeaderReminder), or empty; Due is that fire's due time. Each
	// attempt of one fire carries the same ID, so a re-fire after a
	// fault is recognised by the intake's dedupe like any re-send.
	Reminder string
	Due      time.Time
	// Chain is the call chain of a request sent from another hub's turn
	// (HeaderChain): the addresses waiting on it, outermost first.
	Chain Chain

	key string // dedupe key: (Caller, ID)

	answerTo       string
	expectResponse bool
	rec            *record // its outcome in the dedupe window
	claim          ClaimToken
	host           *Host
	responded      atomic.Bool
	tr             *traceContexts // nil: tracing off
}

// ExpectsResponse reports whether the sender awaits a response (a request).
func (d *Delivery) ExpectsResponse() bool { return d.expectResponse }

// Claim returns the claim the activation running this turn held when the
// turn started: the directory's token (its Rev is the KV revision the
// claim was issued at, increasing across the address's claims), or the
// zero token on a host without [Claims]. It is for diagnostics and
// checkers — the nemesis judges that no turn starts under a claim older
// than one another activation already ran under — not for deciding
// ownership: the host does that. Safe to call from the handler's
// goroutines during the turn.
func (d *Delivery) Claim() ClaimToken { return d.claim }

// Respond sends payload as the response to a request. It does not block on
// the requester. For a plain delivery (no response expected) it does nothing
// and returns nil, so one handler serves both. It returns
// [ErrAlreadyResponded] on a second call, or the NATS publish error. If the
// handler returns without responding, the host responds with an empty
// payload (or the handler's error). Safe to call from any goroutine.
func (d *Delivery) Respond(payload []byte) error {
	if !d.expectResponse {
		return nil
	}
	if !d.responded.CompareAndSwap(false, true) {
		return ErrAlreadyResponded
	}
	// Recorded before it is sent (sendResponse): a duplicate that follows
	// the response must find it.
	err := d.host.sendResponse(d, nil, payload)
	if err != nil {
		// The requester must still get its one answer: a Failed
		// handler-error naming why the response could not be sent (for
		// instance a payload over max_payload).
		ferr := &verdict.Error{Reason: verdict.ReasonHandlerError, Message: fmt.Sprintf("response of %d bytes not sent: %v", len(payload), err)}
		d.host.dedupe.responded(d.rec, nil, ferr)
		if serr := d.host.sendAnswer(d.answerTo, d.ID, AnswerResponse, ferr, nil, d.tr); serr != nil {
			d.host.log.Warn("response not sent", "id", d.ID, "err", err, "then", serr)
		}
	}
	return err
}

// entry is a delivery in an inbox, with its settlement flags.
type entry struct {
	Delivery
	// taken: the handler (true via the turn) or a failure owns the outcome.
	taken atomic.Bool
	// replied: the synchronous reply slot is used, by the intake's Accepted
	// or by a failure that happened before it (then err is the reply).
	replied atomic.Bool
	err     error

	// epoch and seq are the delivery's place in a windowed lane
	// (HeaderLane); seq 0 means none.
	epoch string
	seq   uint64
	grant int // seq 1: the window granted to its lane (HeaderWindow), 0 for none
	// reentrant: its chain names its own address and it runs at once
	// beside the waiting turn of that chain (chain.go).
	reentrant bool
	// tc is its turn's context (chain.go), set when its turn starts.
	tc turnCtx
}
