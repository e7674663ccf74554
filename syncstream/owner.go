package syncstream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/plant"
	"github.com/natsmesh/natsmesh/mesh"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// SendTimeout is the default bound of each frame delivery to a subscriber
// (its retry ladder included): a frame is bounded by the sending client's
// request timeout (mesh.WithRequestTimeout, default mesh.DefaultRequestTimeout),
// counted from when the delivery carrying it leaves the owner (a frame waits
// in the owner while FrameWindow deliveries to its subscriber are in flight,
// each bounded so). A subscriber that cannot be reached in that time is
// dropped and recovers by subscribing again.
const SendTimeout = mesh.DefaultRequestTimeout

// Owner is the owning side of a hub's streams, used from inside the hub:
// Handle answers subscribe and unsubscribe deliveries, Publish emits a
// change, Close ends the activation's streams. Handle and Publish are meant
// for the hub's turns (one at a time); the Owner is safe for concurrent use
// nonetheless.
type Owner struct {
	sender   *mesh.Client
	self     subjects.Address
	epoch    uint64
	snapshot func(subjects.Stream) []byte
	log      *slog.Logger

	mu        sync.Mutex
	streams   map[subjects.Stream]*streamState
	callers   map[string]int // subscribers registered per caller (callerOf), across streams
	perStream int            // bound of subscribers per stream (SetSubscriberLimits)
	perCaller int            // bound of subscribers per caller
	refused   int64          // subscribes refused for a bound
	frames    int64
	limit     int // the frames payload bound, once known
}

// Bounds on an owner activation's subscribers (DESIGN §10: every
// per-caller resource is bounded). A subscribe that would register a new
// subscriber beyond either is refused Ignored (verdict.ErrInboxFull, the
// message naming the bound): the subscription tears down and reports it
// through Err. A subscriber already registered subscribing again is not a
// new one.
const (
	// DefaultMaxStreamSubscribers bounds the subscribers of one stream of
	// one owner address.
	DefaultMaxStreamSubscribers = 1024
	// DefaultMaxCallerSubscribers bounds the subscribers one caller
	// registers with one owner address, across its streams: the caller is
	// the sending node generation (hub.Delivery.Sender), the process that
	// activates the subscriber addresses.
	DefaultMaxCallerSubscribers = 256
)

// streamState is one stream's version and subscribers (guarded by the
// owner's mutex).
type streamState struct {
	version uint64
	subs    []*outbox // one per subscriber address; few, and Publish walks them
}

// streamLocked returns stream's state, creating it.
func (o *Owner) streamLocked(stream subjects.Stream) *streamState {
	st := o.streams[stream]
	if st == nil {
		st = &streamState{}
		o.streams[stream] = st
	}
	return st
}

// find returns the outbox of sub, or -1.
func (st *streamState) find(sub subjects.Address) int {
	for i, ob := range st.subs {
		if ob.sub == sub {
			return i
		}
	}
	return -1
}

// remove forgets ob, if it is there, and reports whether it was.
func (st *streamState) remove(ob *outbox) bool {
	for i, x := range st.subs {
		if x == ob {
			st.subs[i] = st.subs[len(st.subs)-1]
			st.subs[len(st.subs)-1] = nil
			st.subs = st.subs[:len(st.subs)-1]
			return true
		}
	}
	return false
}

// dropLocked marks ob dead and forgets it from st and from its caller's
// count. Called with o.mu held.
func (o *Owner) dropLocked(st *streamState, ob *outbox) {
	ob.dead, ob.pending = true, nil
	if st != nil && st.remove(ob) {
		o.uncountLocked(ob.caller)
	}
}

func (o *Owner) uncountLocked(caller string) {
	if c := o.callers[caller]; c > 1 {
		o.callers[caller] = c - 1
	} else {
		delete(o.callers, caller)
	}
}

// SetSubscriberLimits sets the bounds of subscribers per stream and per
// caller (DefaultMaxStreamSubscribers, DefaultMaxCallerSubscribers); zero
// or negative keeps a bound's default. Subscribers already registered
// stay. Safe for concurrent use; call it before the activation serves.
func (o *Owner) SetSubscriberLimits(perStream, perCaller int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if perStream > 0 {
		o.perStream = perStream
	}
	if perCaller > 0 {
		o.perCaller = perCaller
	}
}

// Refused returns how many subscribes the owner refused for a bound.
func (o *Owner) Refused() int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.refused
}

// callerOf is the caller a subscribe counts against: the outside caller
// (never set: the ingress refuses the protocol) or the sending node
// generation.
func callerOf(d *hub.Delivery) string {
	switch {
	case d.Caller != "":
		return d.Caller
	case d.Sender != "":
		return "node:" + d.Sender
	}
	return "anon"
}

// framesLimitLocked returns the bound of a frames payload: MaxFramesBytes,
// or half the server's max_payload if that is less.
func (o *Owner) framesLimitLocked() int {
	if o.limit > 0 {
		return o.limit
	}
	m := o.sender.MaxPayload()
	if m <= 0 {
		return MaxFramesBytes // not connected yet: not cached
	}
	o.limit = int(min(m/2, MaxFramesBytes))
	return o.limit
}

// FrameWindow is how many frame deliveries the owner keeps in flight to one
// subscriber of one stream. Frames published while they are all in flight
// wait in the owner and leave together, in one delivery, when one of them
// settles: a stream's rate is not one frame per round trip.
const FrameWindow = 4

// MaxFramesBytes bounds the payload of a delivery that carries several
// frames (a frame larger than that travels alone). It is halved for a
// server whose max_payload is less than twice as large.
const MaxFramesBytes = 64 << 10

// outbox is the owner's side of one subscriber's lane (subscriber, stream).
// Its fields are guarded by the owner's mutex. Only the goroutine that set
// issuing hands deliveries to the client, so they leave in frame order.
type outbox struct {
	sub     subjects.Address
	stream  subjects.Stream
	caller  string   // whom it counts against (callerOf)
	legacy  bool     // the subscriber reads only JSON frames: one per delivery; else the frames encoding
	pending [][]byte // the payloads of the deliveries to send, in order
	last    int      // the length of the last frames payload taken (sizes the next buffer)
	flight  int      // deliveries in flight
	issuing bool
	dead    bool // dropped or unsubscribed: nothing more is sent
	closed  bool // the owner closed: failures are expected
}

// NewOwner returns the owner side for the activation of self. sender
// delivers the frames (the node's client); snapshot returns a stream's full
// state. The epoch is taken from the clock at creation: a later activation
// has a later epoch, and subscribers do not depend on clocks agreeing (they
// follow the epoch the response to their subscribe names).
func NewOwner(sender *mesh.Client, self subjects.Address, snapshot func(subjects.Stream) []byte, log *slog.Logger) *Owner {
	if log == nil {
		log = slog.Default()
	}
	// Real clock: the epoch is on the wire, ordered across activations.
	return &Owner{
		sender: sender, self: self, epoch: uint64(time.Now().UnixNano()), snapshot: snapshot, log: log,
		streams: map[subjects.Stream]*streamState{}, callers: map[string]int{},
		perStream: DefaultMaxStreamSubscribers, perCaller: DefaultMaxCallerSubscribers,
	}
}

// Epoch returns the activation's epoch.
func (o *Owner) Epoch() uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.epoch
}

// Resume continues streams across activations for a hub with durable state
// (DESIGN §7a): the owner takes epoch (which must be greater than every
// earlier activation's, e.g. hub.State.Epoch) and each stream's last
// version, so subscribers following the address see (epoch, version) go on
// increasing and the next snapshot carries the stored state. Call it before
// the activation serves.
func (o *Owner) Resume(epoch uint64, versions map[subjects.Stream]uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.epoch = epoch
	for s, v := range versions {
		o.streamLocked(subjects.StreamIdentity(s)).version = v
	}
}

// Version returns the stream's version: that of its last change (0 if
// none).
func (o *Owner) Version(stream subjects.Stream) uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	if st := o.streams[subjects.StreamIdentity(stream)]; st != nil {
		return st.version
	}
	return 0
}

// Pinned reports whether the activation has subscribers; a hub embedding an
// Owner should implement hub.Pinner with it, so it is not idle-collected
// under its subscribers.
func (o *Owner) Pinned() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, st := range o.streams {
		if len(st.subs) > 0 {
			return true
		}
	}
	return false
}

// Subscribers returns how many subscribers the stream has.
func (o *Owner) Subscribers(stream subjects.Stream) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	if st := o.streams[subjects.StreamIdentity(stream)]; st != nil {
		return len(st.subs)
	}
	return 0
}

// Handle handles d if it is a subscribe or unsubscribe delivery and reports
// whether it was. A subscribe registers the subscriber, sends it the
// stream's full state as a snapshot frame and answers the request with the
// epoch and version; a malformed one, or one an outside caller sent (the
// protocol is node to node only, so epoch and version are told only to
// nodes), returns verdict.ErrBadRequest; one over a bound of subscribers
// (SetSubscriberLimits) returns verdict.ErrInboxFull (Ignored) and
// registers nothing.
func (o *Owner) Handle(d *hub.Delivery) (bool, error) {
	switch d.Type {
	case TypeSubscribe, TypeUnsubscribe:
	default:
		return false, nil
	}
	if d.Caller != "" {
		return true, verdict.New(verdict.ReasonBadRequest, "%s is node to node only: an outside caller may not send it", d.Type)
	}
	var req subscribeRequest
	if err := json.Unmarshal(d.Payload, &req); err != nil || req.Subscriber.Validate() != nil || req.Stream.Validate() != nil {
		return true, verdict.New(verdict.ReasonBadRequest, "malformed %s request", d.Type)
	}
	stream := subjects.StreamIdentity(req.Stream)
	caller := callerOf(d)
	o.mu.Lock()
	st := o.streamLocked(stream)
	i := st.find(req.Subscriber)
	if d.Type == TypeUnsubscribe {
		if i >= 0 {
			o.dropLocked(st, st.subs[i])
		}
		o.mu.Unlock()
		return true, d.Respond(nil)
	}
	legacy := req.Format < FramesFormat
	var ob *outbox
	if i >= 0 {
		ob = st.subs[i]
	}
	if ob == nil || ob.legacy != legacy {
		if ob == nil {
			switch {
			case len(st.subs) >= o.perStream:
				o.refused++
				o.mu.Unlock()
				return true, verdict.New(verdict.ReasonInboxFull, "stream %q of %s has %d subscribers, the bound", stream, o.self, o.perStream)
			case o.callers[caller] >= o.perCaller:
				o.refused++
				o.mu.Unlock()
				return true, verdict.New(verdict.ReasonInboxFull, "%s has %d subscribers of one caller, the bound", o.self, o.perCaller)
			}
		} else {
			o.dropLocked(st, ob)
		}
		// A subscriber already there keeps its outbox: the snapshot
		// follows the frames queued before it.
		ob = &outbox{sub: req.Subscriber, stream: stream, caller: caller, legacy: legacy}
		if !(plant.On(plant.StaleStream) && st.version > 0) {
			st.subs = append(st.subs, ob)
			o.callers[caller]++
		} // else planted: a subscriber new to a resumed stream gets its snapshot, never a delta
	}
	v, epoch := st.version, o.epoch
	o.mu.Unlock()
	snap := Frame{Epoch: epoch, Version: v, Snapshot: true, Attempt: req.Attempt, Data: o.snapshot(stream)}
	o.mu.Lock()
	p := o.queueLocked(ob, &snap)
	o.mu.Unlock()
	o.flush(ob, p)
	return true, d.Respond(encode(subscribeReply{Epoch: epoch, Version: v}))
}

// Publish emits data as the next delta frame of stream to every subscriber,
// in order: it does not wait for them.
func (o *Owner) Publish(stream subjects.Stream, data []byte) {
	stream = subjects.StreamIdentity(stream)
	o.mu.Lock()
	st := o.streamLocked(stream)
	st.version++
	f := Frame{Epoch: o.epoch, Version: st.version, Data: data}
	subs := st.subs
	if len(subs) == 1 { // the common case, without a slice
		ob := subs[0]
		p := o.queueLocked(ob, &f)
		o.mu.Unlock()
		o.flush(ob, p)
		return
	}
	var start []*outbox
	var payloads [][]byte
	for _, ob := range subs {
		if p := o.queueLocked(ob, &f); p != nil {
			start, payloads = append(start, ob), append(payloads, p)
		}
	}
	o.mu.Unlock()
	for i, ob := range start {
		o.flush(ob, payloads[i])
	}
}

// Close tells every subscriber that this activation's streams end (they
// subscribe again, to the next activation) and forgets them.
func (o *Owner) Close() {
	o.mu.Lock()
	f := Frame{Epoch: o.epoch, Closed: true}
	var start []*outbox
	var payloads [][]byte
	for _, st := range o.streams {
		subs := st.subs
		st.subs = nil
		for _, ob := range subs {
			o.uncountLocked(ob.caller)
			ob.closed = true
			if p := o.queueLocked(ob, &f); p != nil {
				start, payloads = append(start, ob), append(payloads, p)
			}
		}
	}
	o.mu.Unlock()
	for i, ob := range start {
		o.flush(ob, payloads[i])
	}
}

// Frames returns how many frames were queued to subscribers (each is sent
// unless its subscriber is dropped or unsubscribes first); a frame to n
// subscribers counts n times.
func (o *Owner) Frames() int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.frames
}

// queueLocked queues f to ob, encoded (the caller may reuse f.Data); if ob
// may send now and no goroutine is sending for it, it returns the payload to
// send and the caller, after unlocking, calls flush with it. Called with
// o.mu held.
func (o *Owner) queueLocked(ob *outbox, f *Frame) []byte {
	if ob.dead {
		return nil
	}
	o.frames++
	if ob.legacy {
		ob.pending = append(ob.pending, encode(*f)) // a copy: f stays on the caller's stack
	} else {
		limit := o.framesLimitLocked()
		n := len(ob.pending)
		if n == 0 || len(ob.pending[n-1])+recordSize(f) > limit {
			// Sized for what the last one carried, so a burst does not
			// regrow each buffer from small.
			size := min(limit, max(512, 2*ob.last, 1+recordSize(f)))
			ob.pending = append(ob.pending, AppendFrames(make([]byte, 0, size), *f))
		} else {
			ob.pending[n-1] = appendRecord(ob.pending[n-1], f)
		}
	}
	if ob.issuing {
		return nil
	}
	p := ob.takeLocked()
	if p != nil {
		ob.issuing = true
	}
	return p
}

// takeLocked takes the next payload to send, if ob's window has room, and
// counts it in flight.
func (ob *outbox) takeLocked() []byte {
	if ob.dead || ob.flight >= FrameWindow || len(ob.pending) == 0 {
		return nil
	}
	p := ob.pending[0]
	ob.pending[0] = nil
	ob.pending = ob.pending[1:]
	ob.flight++
	ob.last = len(p)
	return p
}

// flush sends p and then whatever else ob may send, until its window is
// full or nothing is queued; it is called only by the goroutine that set
// ob.issuing (p non-nil), so deliveries reach the client in frame order.
func (o *Owner) flush(ob *outbox, p []byte) {
	for p != nil {
		o.deliver(ob, p)
		o.mu.Lock()
		if p = ob.takeLocked(); p == nil {
			ob.issuing = false
		}
		o.mu.Unlock()
	}
}

// Telling a dropped subscriber: DropNoticeAttempts closed frames at most,
// the first at once, then DropNoticeBackoff doubling to 5 s between them.
const (
	DropNoticeAttempts = 8
	DropNoticeBackoff  = 100 * time.Millisecond
)

// tellDropped tells a subscriber whose frame delivery failed (so it missed
// frames, and the owner dropped it) to subscribe again, with a closed frame
// of this activation's epoch on its lane — behind whatever of the lane is
// still in flight — so that it is never silently stale (DESIGN §7): it
// resubscribes and gets a snapshot. A subscriber too slow to take it (its
// inbox full, a timeout: why it was dropped) is told again after a
// back-off; one that cannot be reached at all (the mesh's own re-sends
// failed: its node is gone, and its subscriptions re-arm with their
// session) or refuses it for good is left.
func (o *Owner) tellDropped(ob *outbox, epoch uint64) {
	f := Frame{Epoch: epoch, Closed: true}
	d := mesh.Delivery{From: o.self, To: ob.sub, Stream: ob.stream, Type: TypeFrames, Payload: AppendFrames(nil, f),
		Idempotent: true}
	if ob.legacy {
		d.Type, d.Payload = TypeFrame, encode(f)
	}
	wait := DropNoticeBackoff
	for i := 0; i < DropNoticeAttempts; i++ {
		d.ID = "" // a fresh delivery each time: the last one was not taken
		_, err := o.sender.Deliver(context.Background(), d)
		switch {
		case err == nil:
			o.log.Info("sync-stream subscriber told to subscribe again", "owner", string(o.self), "subscriber", string(ob.sub), "stream", string(ob.stream))
			return
		case verdict.Classify(err) != verdict.Ignored && !timedOut(err):
			return // unreachable or refused for good
		}
		o.sender.Clock().Sleep(wait)
		wait = min(2*wait, 5*time.Second)
	}
	o.log.Warn("sync-stream subscriber dropped and not told: it refused every notice", "owner", string(o.self), "subscriber", string(ob.sub), "stream", string(ob.stream))
}

// timedOut reports whether err is a delivery's timeout (DESIGN §3: the
// callee may hold it), not the caller's cancellation.
func timedOut(err error) bool {
	return !errors.Is(err, context.Canceled) && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout))
}

// deliver hands one payload to the client on the lane (subscriber, stream);
// DeliverAsyncFunc keeps the call order and pipelines the lane's deliveries,
// with no goroutine of their own while they wait. When a delivery settles
// the outbox sends what queued meanwhile. A subscriber that cannot be
// reached is dropped.
func (o *Owner) deliver(ob *outbox, p []byte) {
	d := mesh.Delivery{From: o.self, To: ob.sub, Stream: ob.stream, Type: TypeFrames, Payload: p,
		Idempotent: true} // the subscriber's (epoch, version) guard drops a frame applied twice
	if ob.legacy {
		d.Type = TypeFrame
	}
	o.sender.DeliverAsyncFunc(context.Background(), d, func(r mesh.Result) {
		o.mu.Lock()
		ob.flight--
		if r.Err != nil && !ob.closed && !ob.dead {
			o.dropLocked(o.streams[ob.stream], ob)
			epoch := o.epoch
			o.mu.Unlock()
			o.log.Info("sync-stream subscriber dropped", "owner", string(o.self), "subscriber", string(ob.sub), "stream", string(ob.stream), "err", fmt.Sprint(r.Err))
			go o.tellDropped(ob, epoch)
			return
		}
		var next []byte
		if !ob.issuing {
			if next = ob.takeLocked(); next != nil {
				ob.issuing = true
			}
		}
		o.mu.Unlock()
		if next != nil {
			o.flush(ob, next)
		}
	})
}
