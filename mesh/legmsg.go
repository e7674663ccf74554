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
	numLegHeaders
)

var legHeaderNames = [numLegHeaders]string{
	hdrID:             hub.HeaderID,
	hdrAttempt:        hub.HeaderAttempt,
	hdrAnswerTo:       hub.HeaderAnswerTo,
	hdrType:           hub.HeaderType,
	hdrFrom:           hub.HeaderFrom,
	hdrExpectResponse: hub.HeaderExpectResponse,
	hdrLane:           hub.HeaderLane,
}

type legMsg struct {
	msg  nats.Msg
	vals [numLegHeaders]string // backing arrays of the header values
}

var legMsgPool = sync.Pool{New: func() any {
	return &legMsg{msg: nats.Msg{Header: make(nats.Header, numLegHeaders+2)}}
}}

// getLegMsg returns an empty leg message (no subject, headers or data).
func getLegMsg() *legMsg { return legMsgPool.Get().(*legMsg) }

// putLegMsg gives lm back; it must not be used afterwards.
func putLegMsg(lm *legMsg) {
	h := lm.msg.Header
	clear(h)
	lm.msg = nats.Msg{Header: h}
	lm.vals = [numLegHeaders]string{}
	legMsgPool.Put(lm)
}

// set sets header i to the single value v without allocating.
func (lm *legMsg) set(i int, v string) {
	lm.vals[i] = v
	lm.msg.Header[legHeaderNames[i]] = lm.vals[i : i+1 : i+1]
}
