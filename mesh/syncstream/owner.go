package syncstream

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/mesh"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// SendTimeout is the default bound of each frame delivery to a subscriber
// (its retry ladder included): a frame is bounded by the sending client's
// request timeout (mesh.WithRequestTimeout, default mesh.DefaultRequestTimeout),
// counted from Publish. A subscriber that cannot be reached in that time is
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

	mu      sync.Mutex
	version map[subjects.Stream]uint64
	subs    map[subjects.Stream]map[subjects.Address]bool
	frames  int64
}

// NewOwner returns the owner side for the activation of self. sender
// delivers the frames (the node's client); snapshot returns a stream's full
// state. The epoch is taken from the clock at creation: a later activation
// has a later epoch, and subscribers do not depend on clocks agreeing (they
// adopt the epoch of the snapshot answering them).
func NewOwner(sender *mesh.Client, self subjects.Address, snapshot func(subjects.Stream) []byte, log *slog.Logger) *Owner {
	if log == nil {
		log = slog.Default()
	}
	return &Owner{
		sender: sender, self: self, epoch: uint64(time.Now().UnixNano()), snapshot: snapshot, log: log,
		version: map[subjects.Stream]uint64{}, subs: map[subjects.Stream]map[subjects.Address]bool{},
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
		o.version[subjects.StreamIdentity(s)] = v
	}
}

// Version returns the stream's version: that of its last change (0 if
// none).
func (o *Owner) Version(stream subjects.Stream) uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.version[subjects.StreamIdentity(stream)]
}

// Pinned reports whether the activation has subscribers; a hub embedding an
// Owner should implement hub.Pinner with it, so it is not idle-collected
// under its subscribers.
func (o *Owner) Pinned() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, s := range o.subs {
		if len(s) > 0 {
			return true
		}
	}
	return false
}

// Subscribers returns how many subscribers the stream has.
func (o *Owner) Subscribers(stream subjects.Stream) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.subs[subjects.StreamIdentity(stream)])
}

// Handle handles d if it is a subscribe or unsubscribe delivery and reports
// whether it was. A subscribe registers the subscriber, sends it the
// stream's full state as a snapshot frame and answers the request with the
// epoch and version; a malformed one returns verdict.ErrBadRequest.
func (o *Owner) Handle(d *hub.Delivery) (bool, error) {
	switch d.Type {
	case TypeSubscribe, TypeUnsubscribe:
	default:
		return false, nil
	}
	var req subscribeRequest
	if err := json.Unmarshal(d.Payload, &req); err != nil || req.Subscriber.Validate() != nil || req.Stream.Validate() != nil {
		return true, verdict.New(verdict.ReasonBadRequest, "malformed %s request", d.Type)
	}
	stream := subjects.StreamIdentity(req.Stream)
	o.mu.Lock()
	if d.Type == TypeUnsubscribe {
		delete(o.subs[stream], req.Subscriber)
		o.mu.Unlock()
		return true, d.Respond(nil)
	}
	if o.subs[stream] == nil {
		o.subs[stream] = map[subjects.Address]bool{}
	}
	o.subs[stream][req.Subscriber] = true
	v, epoch := o.version[stream], o.epoch
	o.mu.Unlock()
	o.send(req.Subscriber, stream, Frame{Epoch: epoch, Version: v, Snapshot: true, Attempt: req.Attempt, Data: o.snapshot(stream)})
	return true, d.Respond(encode(subscribeReply{Epoch: epoch, Version: v}))
}

// Publish emits data as the next delta frame of stream to every subscriber,
// in order: it does not wait for them.
func (o *Owner) Publish(stream subjects.Stream, data []byte) {
	stream = subjects.StreamIdentity(stream)
	o.mu.Lock()
	o.version[stream]++
	v, epoch := o.version[stream], o.epoch
	subs := make([]subjects.Address, 0, len(o.subs[stream]))
	for s := range o.subs[stream] {
		subs = append(subs, s)
	}
	o.mu.Unlock()
	for _, s := range subs {
		o.send(s, stream, Frame{Epoch: epoch, Version: v, Data: data})
	}
}

// Close tells every subscriber that this activation's streams end (they
// subscribe again, to the next activation) and forgets them.
func (o *Owner) Close() {
	o.mu.Lock()
	all, epoch := o.subs, o.epoch
	o.subs = map[subjects.Stream]map[subjects.Address]bool{}
	o.mu.Unlock()
	for stream, subs := range all {
		for s := range subs {
			o.send(s, stream, Frame{Epoch: epoch, Closed: true})
		}
	}
}

// Frames returns how many frames were sent.
func (o *Owner) Frames() int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.frames
}

// send delivers a frame on the lane (subscriber, stream); DeliverAsyncFunc
// keeps the call order, so frames leave in version order, pipelined in the
// lane's window, with no goroutine of their own while they wait in the lane.
// A subscriber that cannot be reached is dropped.
func (o *Owner) send(sub subjects.Address, stream subjects.Stream, f Frame) {
	o.mu.Lock()
	o.frames++
	o.mu.Unlock()
	closed := f.Closed
	o.sender.DeliverAsyncFunc(context.Background(), mesh.Delivery{From: o.self, To: sub, Stream: stream, Type: TypeFrame, Payload: encode(f),
		Idempotent: true}, // the subscriber's (epoch, version) guard drops a frame applied twice
		func(r mesh.Result) {
			if r.Err == nil || closed {
				return
			}
			o.mu.Lock()
			delete(o.subs[stream], sub)
			o.mu.Unlock()
			o.log.Info("sync-stream subscriber dropped", "owner", string(o.self), "subscriber", string(sub), "stream", string(stream), "err", fmt.Sprint(r.Err))
		})
}
