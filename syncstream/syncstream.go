// Package syncstream carries a hub's state to subscribing services (DESIGN
// §7): an owner hub emits frames (epoch, version, payload) on a stream; a
// subscriber receives them as deliveries on the lane (subscriber, stream) at
// an address its own process activates, and applies a frame only when
// (epoch, version) is greater than its mirror's pair, so frames reordered or
// repeated on the way are dropped (and counted), never applied over newer
// ones.
//
// On subscribe the owner sends the stream's full state first (a snapshot
// frame naming the subscribe attempt it answers), then every change as a
// delta frame. The epoch is the owner activation's: a new activation of the
// owner (after a crash, a move, a restart) starts a new epoch. A snapshot
// answering the subscriber's latest subscribe passes the same guard as any
// frame (one equal to the mirror's pair, the same activation answering
// again, is handed over once), with one exception, so clock skew between
// nodes cannot wedge it:
// the snapshot of the epoch the attempt's response named (the activation
// that answered) is applied even if that epoch is below the mirror's, and
// if the guard dropped it before the response came, the subscriber
// subscribes again. After a snapshot it drops every frame of another epoch,
// or of its epoch and an older or equal version.
//
// Frames travel in the compact frames encoding (AppendFrames, DecodeFrames;
// docs/protocol.md §8a), several to a delivery when they are published
// faster than the subscriber's round trip: the owner keeps FrameWindow
// deliveries in flight per subscriber and stream, and what is published
// meanwhile leaves together in the next one. Each frame still passes the
// guard on its own.
//
// Recovery: when the owner's node departs, the owner closes the stream, or
// a subscribe attempt fails with a resendable verdict, the subscription
// subscribes again by itself (three immediate grace attempts, then back-off
// from 1 s doubling to a 60 s cap); when an attempt fails terminally
// (Failed, Ignored, or Unavailable that is not resendable) it tears down
// once and reports the error through Err and Closed.
//
// Sync streams need the multi-node membership (the owner resolves the
// subscriber's address through the directory).
package syncstream

import (
	"encoding/json"

	"github.com/natsmesh/natsmesh/subjects"
)

// Delivery types of the protocol.
const (
	TypeSubscribe   = "natsmesh.subscribe"
	TypeUnsubscribe = "natsmesh.unsubscribe"
	// TypeFrame carries one frame as JSON, to a subscriber that did not
	// ask for the frames encoding (an older one); still read.
	TypeFrame = "natsmesh.frame"
	// TypeFrames carries one or more frames in the frames encoding
	// (AppendFrames), to a subscriber that asked for it.
	TypeFrames = "natsmesh.frames"
)

// SubscriberKind is the internal hub kind of subscriber addresses,
// "_sub/<node>/<id>"; kinds starting with "_" are never placed.
const SubscriberKind = "_sub"

// Frame is one state update of a stream.
type Frame struct {
	// Epoch identifies the owner activation that emitted the frame.
	Epoch uint64 `json:"epoch"`
	// Version orders the frames of one epoch: each change increments it;
	// a snapshot carries the version of the last change (0 if none yet).
	Version uint64 `json:"version"`
	// Snapshot: Data is the full state, not a change.
	Snapshot bool `json:"snapshot,omitempty"`
	// Attempt names the subscribe attempt a snapshot answers.
	Attempt string `json:"attempt,omitempty"`
	// Closed: the owner activation is going away; the subscriber
	// subscribes again (Data is empty).
	Closed bool `json:"closed,omitempty"`
	// Data is the application's payload.
	Data []byte `json:"data,omitempty"`
}

// newer reports whether f is after the pair (epoch, version).
func (f Frame) newer(epoch, version uint64) bool {
	return f.Epoch > epoch || f.Epoch == epoch && f.Version > version
}

type subscribeRequest struct {
	Subscriber subjects.Address `json:"subscriber"`
	Stream     subjects.Stream  `json:"stream"`
	Attempt    string           `json:"attempt"`
	// Format is the highest frames encoding format the subscriber reads
	// (FramesFormat); 0 or absent: it reads only JSON natsmesh.frame.
	Format int `json:"format,omitempty"`
}

type subscribeReply struct {
	Epoch   uint64 `json:"epoch"`
	Version uint64 `json:"version"`
}

func encode(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}
