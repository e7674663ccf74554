package mesh

import (
	"sync"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/hub"
)

// A leg's request message is pooled (legMsg): nats.go encodes the headers
// and copies subject, headers and payload into the connection's buffer
// before PublishMsg returns, so the message, its header map and the header
// values' one-element slices can serve the next leg. Nothing keeps a
// reference to a published message.

// Request headers a leg may carry, as indexes into legMsg.vals.
const (
	hdrID = iota
	hdrAttempt
	hdrAnswerTo
	hdrType
	hdrFrom
	hdrExpectResponse
	hdrLane
	hdrCaller
	hdrAccept
	numLegHeaders // at most 16: present and used are bit sets in a uint16
)

var legHeaderNames = [numLegHeaders]string{
	hdrID:             hub.HeaderID,
	hdrAttempt:        hub.HeaderAttempt,
	hdrAnswerTo:       hub.HeaderAnswerTo,
	hdrType:           hub.HeaderType,
	hdrFrom:           hub.HeaderFrom,
	hdrExpectResponse: hub.HeaderExpectResponse,
	hdrLane:           hub.HeaderLane,
	hdrCaller:         hub.HeaderCaller,
	hdrAccept:         hub.HeaderAccept,
}

type legMsg struct {
	msg  nats.Msg
	vals [numLegHeaders]string // backing arrays of the header values
	// Header keys of the last use stay in the map (their value slices are
	// vals[i:i+1], so setting one again is a store, not a map assignment);
	// ready deletes those not set this time.
	present, used uint16
	foreign       bool // keys not in legHeaderNames were added (trace context): clear the map
}

var legMsgPool = sync.Pool{New: func() any {
	return &legMsg{msg: nats.Msg{Header: make(nats.Header, numLegHeaders+2)}}
}}

// getLegMsg returns an empty leg message (no subject or data, no header set).
func getLegMsg() *legMsg { return legMsgPool.Get().(*legMsg) }

// putLegMsg gives lm back; it must not be used afterwards.
func putLegMsg(lm *legMsg) {
	lm.reset()
	legMsgPool.Put(lm)
}

// reset empties lm for its next leg, keeping its header map and the
// headers' value slices.
func (lm *legMsg) reset() {
	h := lm.msg.Header
	if lm.foreign {
		clear(h)
		lm.present, lm.foreign = 0, false
	}
	lm.msg = nats.Msg{Header: h}
	lm.vals = [numLegHeaders]string{}
	lm.used = 0
}

// set sets header i to the single value v.
func (lm *legMsg) set(i int, v string) {
	lm.vals[i] = v
	bit := uint16(1) << i
	lm.used |= bit
	if lm.present&bit == 0 {
		lm.msg.Header[legHeaderNames[i]] = lm.vals[i : i+1 : i+1]
		lm.present |= bit
	}
}

// header returns the header map for additions other than set's (trace
// context).
func (lm *legMsg) header() nats.Header {
	lm.foreign = true
	return lm.msg.Header
}

// ready removes the headers of an earlier use that were not set this time;
// call it right before publishing.
func (lm *legMsg) ready() *nats.Msg {
	if stale := lm.present &^ lm.used; stale != 0 {
		for i := range numLegHeaders {
			if stale&(1<<i) != 0 {
				delete(lm.msg.Header, legHeaderNames[i])
			}
		}
		lm.present = lm.used
	}
	return &lm.msg
}
