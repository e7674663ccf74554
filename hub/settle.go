package hub

import (
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/verdict"
)

// sendResponse records request d's response (or its failure) in the dedupe
// window and publishes it to d's answer subject and to those of the
// duplicates accepted meanwhile from other senders; it returns the error of
// the publish to d's own answer subject.
func (h *Host) sendResponse(d *Delivery, err error, payload []byte) error {
	also := h.dedupe.responded(d.rec, payload, err)
	for _, to := range also {
		if serr := h.sendAnswer(to, d.ID, AnswerResponse, err, payload, d.tr); serr != nil {
			// Still one answer for that sender: why it was not sent.
			ferr := &verdict.Error{Reason: verdict.ReasonHandlerError, Message: fmt.Sprintf("response of %d bytes not sent: %v", len(payload), serr)}
			if serr := h.sendAnswer(to, d.ID, AnswerResponse, ferr, nil, d.tr); serr != nil {
				h.log.Warn("response not sent", "id", d.ID, "to", to, "err", serr)
			}
		}
	}
	return h.sendAnswer(d.answerTo, d.ID, AnswerResponse, err, payload, d.tr)
}

// sendAnswer publishes a late verdict or a response to an answer subject.
//
// tr holds the span context the answer continues (nil: tracing off).
func (h *Host) sendAnswer(to, id, kind string, err error, payload []byte, tr *traceContexts) error {
	if to == "" {
		return nil
	}
	am := answerMsgPool.Get().(*answerMsg)
	defer am.put()
	am.msg.Subject, am.msg.Data = to, payload
	am.set(0, HeaderID, id)
	am.set(1, HeaderAnswer, kind)
	am.set(2, HeaderAnswerToken, AnswerTokenOf(h.answerKey, id))
	injectTrace(am.msg.Header, tr)
	if err == nil { // verdict.Encode's Accepted, without its allocations
		am.set(3, verdict.HeaderVerdict, verdict.Accepted.String())
		am.set(4, verdict.HeaderNode, h.nodeID)
	} else {
		verdict.Encode(am.msg.Header, err, h.nodeID)
	}
	return h.cfg.Conn.PublishMsg(&am.msg)
}

// answerMsg is a pooled answer message (sendAnswer): nats.go copies a
// message into the connection's buffer before PublishMsg returns, so its
// header map and the values' one-element slices serve the next answer.
type answerMsg struct {
	msg  nats.Msg
	vals [5]string
}

func (am *answerMsg) set(i int, k, v string) {
	am.vals[i] = v
	am.msg.Header[k] = am.vals[i : i+1 : i+1]
}

func (am *answerMsg) put() {
	h := am.msg.Header
	clear(h)
	*am = answerMsg{msg: nats.Msg{Header: h}}
	answerMsgPool.Put(am)
}

// sendLate publishes e's late verdict; for a request it says so
// (HeaderExpectResponse), so that a sender no longer awaiting it counts it
// as unmatched instead of reading it as a plain delivery's.
func (h *Host) sendLate(e *entry, err error) error { return h.sendLateTo(e.answerTo, e, err) }

// sendLateTo publishes e's late verdict to answer subject to.
func (h *Host) sendLateTo(to string, e *entry, err error) error {
	msg := &nats.Msg{Subject: to, Header: nats.Header{}}
	msg.Header.Set(HeaderID, e.ID)
	msg.Header.Set(HeaderAnswer, AnswerVerdict)
	msg.Header.Set(HeaderAnswerToken, AnswerTokenOf(h.answerKey, e.ID))
	if e.expectResponse {
		msg.Header.Set(HeaderExpectResponse, "true")
	}
	injectTrace(msg.Header, e.tr)
	verdict.Encode(msg.Header, err, h.nodeID)
	return h.cfg.Conn.PublishMsg(msg)
}

// regateAfter is how long after its serving gate a turn's handler may
// start without the gate being asked again (regate).
const regateAfter = 10 * time.Millisecond

// regate asks the serving gate again for a turn that passed it at gated,
// if the turn reaches its handler more than regateAfter later: the process
// may have been stopped in between (SIGSTOP, a freeze; or starved), and
// declared gone and taken over meanwhile. A gate asked after such a pause
// waits for a heartbeat issued after it (membership's watchdog), which a
// generation declared gone never gets. Found by the 30-minute soak (round
// 3): a node frozen 5.9 s between its gate and its handler ran that turn
// 1 ms after waking, beside its successor's turns. What remains is the few
// instructions between regate and the handler's first: a stop that lands
// there is answered by the store's fencing (DESIGN §7a), as for a turn
// already running.
func (h *Host) regate(gated time.Time) error {
	if h.cfg.Clock.Since(gated) <= regateAfter {
		return nil
	}
	return h.serving()
}

// fail settles an accepted entry with a failure, unless the handler took it:
// in the synchronous reply if the intake has not answered yet, else as one
// late answer.
func (h *Host) fail(e *entry, err error) {
	if !e.taken.CompareAndSwap(false, true) {
		return
	}
	h.failTaken(e, err)
}

// failTaken is fail for an entry its turn already took, whose handler it
// will not run (regate).
func (h *Host) failTaken(e *entry, err error) {
	e.err = err
	also := h.dedupe.failed(e.rec, err) // a resendable failure forgets the ID: its re-send is accepted
	for _, to := range also {
		// Duplicates accepted from other senders while e was queued.
		if serr := h.sendLateTo(to, e, err); serr != nil {
			h.log.Warn("late verdict not sent", "id", e.ID, "to", to, "err", serr)
		}
	}
	if e.replied.CompareAndSwap(false, true) {
		return // the intake will send err as the reply
	}
	h.late.Add(1)
	h.lateBy[verdict.ReasonOf(err)].Add(1)
	if e.answerTo == "" {
		h.log.Warn("delivery failed after acceptance; sender gave no answer subject", "id", e.ID, "address", string(e.To), "err", err)
		return
	}
	if serr := h.sendLate(e, err); serr != nil {
		h.log.Warn("late verdict not sent", "id", e.ID, "err", serr)
	}
}
