package hub

import (
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/internal/plant"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// intake handles one delivery message: it is the subscription callback, so
// it never blocks on anything but short critical sections.
func (h *Host) intake(m *nats.Msg) {
	if m.Reply == "" {
		h.log.Debug("delivery without reply subject dropped", "subject", m.Subject)
		return
	}
	if !h.cfg.Prefix.SafeReply(m.Reply) {
		// Never publish the verdict where the sender chose a subject
		// under "$" or the prefix (a KV bucket, a control subject).
		h.refused.Add(1)
		h.log.Debug("delivery with an unsafe reply subject dropped", "subject", m.Subject, "reply", m.Reply)
		return
	}
	if h.tracer != nil {
		h.startIntake(m)
	}
	e, err := h.parse(m)
	if err != nil {
		h.refuse(m, err)
		return
	}
	if h.tracer != nil {
		h.tagIntake(m, e)
	}
	if f := h.cfg.Fence; f != nil {
		if err := f(); err != nil {
			h.refuse(m, err)
			return
		}
	}
	if r := h.dedupe.lookup(e.key); r != nil && !plant.On(plant.SkipDedupe) {
		h.duplicate(m, e, r)
		return
	}
	if b := h.breaker; b != nil && e.seq <= 1 {
		// A windowed lane's legs past its epoch's first are not counted
		// (DefaultBreakerRate): what they carry was sequence-checked in.
		k := keyOf(&e.Delivery)
		if ok, tripped := b.allow(k); !ok {
			if tripped {
				h.log.Warn("storm breaker tripped", "sender", k.Sender, "target", string(k.Target), "type", k.Type, "stream", string(k.Stream), "rate", b.rate)
			}
			h.breakerRefusals.Add(1)
			h.refuse(m, verdict.New(verdict.ReasonStormBreaker, "storm breaker: sender %q, target %s, type %q, stream %q over %d deliveries/s", k.Sender, k.Target, k.Type, k.Stream, b.rate))
			return
		}
	}
	h.dispatch(m, e)
}

// dispatch puts an accepted-to-be delivery in its activation's inbox and
// answers it, or parks it on its address's claim (a cold address with
// Claims set: the claim runs on its own goroutine, never on the
// subscription's), or refuses it.
func (h *Host) dispatch(m *nats.Msg, e *entry) {
	var a *activation
	for {
		h.mu.RLock()
		draining := h.draining || h.ctx.Err() != nil
		a = h.activations[e.To]
		h.mu.RUnlock()
		if draining {
			h.refuse(m, verdict.New(verdict.ReasonHubShuttingDown, "node %s is draining", h.nodeID))
			return
		}
		if a == nil {
			if h.cfg.Claims != nil {
				parked, err := h.park(m, e)
				if err != nil {
					h.refuse(m, err)
				}
				if parked || err != nil {
					return
				}
				continue // activated meanwhile
			}
			var err error
			if a, err = h.activate(e.To); err != nil {
				h.refuse(m, err)
				return
			}
		}
		// Remembered before it can be settled, so that a failure racing
		// the enqueue finds the record to forget.
		e.rec = h.dedupe.add(e.key, e.expectResponse, e.answerTo)
		err := a.enqueue(e, false)
		if err != nil {
			h.dedupe.forget(e.rec)
			e.rec = nil
		}
		if err == errActivationGone {
			h.mu.RLock()
			closing := h.activations[e.To] == a
			h.mu.RUnlock()
			if closing {
				// Deactivate closed it and waits for its turn in
				// progress: no second activation may start beside that
				// turn. Nothing was accepted: resendable.
				h.refuse(m, verdict.New(verdict.ReasonHubShuttingDown, "activation %s on %s is being deactivated; its turn in progress ends first", e.To, h.nodeID))
				return
			}
			continue // collected as idle just now: activate afresh
		}
		if err != nil {
			h.refuse(m, err)
			return
		}
		break
	}
	h.answerAccepted(m, e)
	if e.reentrant {
		a.runReentrant(e)
		return
	}
	a.kick() // after the reply: its turn does not delay it
}

// duplicate answers a delivery whose ID is in the dedupe window from the
// outcome recorded for it, without enqueuing it again: a request already
// handled gets Accepted and its response again (to the duplicate's answer
// subject), or verdict.ErrResponseGone once the response was dropped; a
// request still queued or running gets Accepted, and its answer goes to the
// duplicate's answer subject too (a different sender's: bounded, past it
// the duplicate is refused); a delivery that failed late gets that failure;
// a plain delivery Accepted. Never Accepted followed by silence.
func (h *Host) duplicate(m *nats.Msg, e *entry, r *record) {
	if r.request && e.expectResponse {
		st, noted := h.dedupe.also(r, e.answerTo)
		if st == recAccepted {
			h.dedupeHits.Add(1)
			if noted {
				// Queued or running: its answer goes to this duplicate's
				// answer subject too.
				h.reply(m, nil)
			} else {
				h.refuse(m, verdict.New(verdict.ReasonInboxFull, "request %s is queued on %s and already owes its response to %d other senders", e.ID, h.nodeID, maxAlsoAnswer+1))
			}
			return
		}
	}
	state, payload, err := h.dedupe.outcomeOf(r)
	if state == recForgotten {
		// Refused late with a resendable verdict since the lookup: the hub
		// holds nothing of it, so this copy is accepted afresh.
		h.dispatch(m, e)
		return
	}
	h.dedupeHits.Add(1)
	switch {
	case state == recFailed:
		h.reply(m, err)
	case !r.request || !e.expectResponse:
		h.reply(m, nil)
	case state == recRespGone:
		h.reply(m, verdict.New(verdict.ReasonResponseGone, "request %s was handled on %s; its response is no longer kept", e.ID, h.nodeID))
	case state == recResponded:
		h.reply(m, nil)
		if serr := h.sendAnswer(e.answerTo, e.ID, AnswerResponse, err, payload, e.tr); serr != nil {
			h.log.Warn("response not re-sent", "id", e.ID, "err", serr)
		}
	default:
		h.reply(m, nil) // a plain delivery queued or running
	}
}

// answerAccepted sends the reply of an enqueued delivery: Accepted, or the
// failure that settled it before this reply.
func (h *Host) answerAccepted(m *nats.Msg, e *entry) {
	h.accepted.Add(1)
	if e.replied.CompareAndSwap(false, true) {
		if e.grant > 0 {
			h.replyGrant(m, e.grant)
			return
		}
		h.reply(m, nil)
	} else {
		// Failed after acceptance but before this reply: the failure is
		// the one verdict, sent synchronously.
		h.reply(m, e.err)
	}
}

// parse reads a delivery message into an entry, or a Failed refusal.
func (h *Host) parse(m *nats.Msg) (*entry, error) {
	d, err := h.cfg.Prefix.ParseDelivery(m.Subject)
	if err != nil {
		return nil, verdict.New(verdict.ReasonInvalidAddress, "%v", err)
	}
	if d.Node != h.cfg.Node {
		return nil, verdict.New(verdict.ReasonNotOwner, "delivery for %s reached %s", d.Node, h.nodeID)
	}
	e := &entry{}
	e.To, e.Stream, e.host = d.Addr, d.Stream, h
	hdr := m.Header
	e.ID = hdr.Get(HeaderID)
	if err := ValidateID(e.ID); err != nil {
		return nil, &verdict.Error{Reason: verdict.ReasonInvalidID, Message: "header " + HeaderID + ": " + err.(*verdict.Error).Message}
	}
	if f := hdr.Get(HeaderFrom); f != "" {
		if err := subjects.Address(f).Validate(); err != nil {
			return nil, verdict.New(verdict.ReasonInvalidAddress, "header %s: %v", HeaderFrom, err)
		}
		e.From = subjects.Address(f)
	}
	e.Type = hdr.Get(HeaderType)
	if len(e.Type) > MaxTypeLen {
		return nil, verdict.New(verdict.ReasonBadRequest, "header %s over %d bytes", HeaderType, MaxTypeLen)
	}
	if r := hdr.Get(HeaderReminder); r != "" {
		due, err := time.Parse(time.RFC3339Nano, hdr.Get(HeaderReminderDue))
		if err != nil || len(r) > MaxIDLen {
			return nil, verdict.New(verdict.ReasonBadRequest, "header %s needs %s in RFC 3339 and at most %d bytes", HeaderReminder, HeaderReminderDue, MaxIDLen)
		}
		e.Reminder, e.Due = r, due
	}
	if v := hdr.Get(HeaderChain); v != "" {
		if e.Chain, err = ParseChain(v); err != nil {
			return nil, err
		}
	}
	e.Attempt = 1
	if s := hdr.Get(HeaderAttempt); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			return nil, verdict.New(verdict.ReasonBadRequest, "header %s: %q is not a positive integer", HeaderAttempt, s)
		}
		e.Attempt = n
	}
	if v := hdr.Get(HeaderLane); v != "" {
		if e.epoch, e.seq, err = ParseLane(v); err != nil {
			return nil, err
		}
	}
	e.answerTo = hdr.Get(HeaderAnswerTo)
	if e.answerTo != "" && !h.answerSubject(e.answerTo) {
		// DESIGN §5: never publish a response or late verdict outside the
		// answer subjects (a control subject, the registry's KV subject).
		return nil, verdict.New(verdict.ReasonBadRequest, "header %s: %q is not a subject under %s", HeaderAnswerTo, e.answerTo, h.ansPrefix)
	}
	if c, ok := hdr[HeaderCaller]; ok {
		if len(c) != 1 {
			return nil, verdict.New(verdict.ReasonBadRequest, "header %s given %d times", HeaderCaller, len(c))
		}
		if err := ValidateCaller(c[0]); err != nil {
			return nil, err
		}
		e.Caller = c[0]
	}
	e.key = dedupeKey(e.Caller, e.ID)
	if e.Sender = hdr.Get(HeaderSender); e.Sender == "" {
		e.Sender = h.senderOf(e.answerTo)
	}
	e.expectResponse = hdr.Get(HeaderExpectResponse) == "true"
	if e.expectResponse && e.answerTo == "" {
		return nil, verdict.New(verdict.ReasonBadRequest, "%s without %s", HeaderExpectResponse, HeaderAnswerTo)
	}
	e.Payload = m.Data
	return e, nil
}

// answerSubject reports whether s is a literal subject under
// <prefix>.ans.: non-empty tokens without wildcards, spaces or control
// characters.
func (h *Host) answerSubject(s string) bool {
	rest, ok := strings.CutPrefix(s, h.ansPrefix)
	if !ok || rest == "" || len(s) > maxAnswerSubjectLen {
		return false
	}
	for tok := range strings.SplitSeq(rest, ".") {
		if tok == "" || tok == "*" || tok == ">" {
			return false
		}
		for i := 0; i < len(tok); i++ {
			if c := tok[i]; c <= ' ' || c == 0x7f {
				return false
			}
		}
	}
	return true
}

// senderOf derives a mesh sender's identity "name.gen" from its answer
// subject <prefix>.ans.<name>.<gen>, or returns "".
func (h *Host) senderOf(answerTo string) string {
	rest, ok := strings.CutPrefix(answerTo, h.ansPrefix)
	if !ok {
		return ""
	}
	if _, err := subjects.ParseNodeID(rest); err != nil {
		return ""
	}
	return rest
}

// reply answers the delivery request with err's verdict (nil: Accepted).
func (h *Host) reply(m *nats.Msg, err error) {
	if h.tracer != nil {
		h.endIntake(m, err)
	}
	r := &nats.Msg{Subject: m.Reply, Header: h.acceptedHdr}
	switch {
	case err != nil:
		r.Header = nats.Header{}
		verdict.Encode(r.Header, err, h.nodeID)
	case wantsCompact(m):
		r.Header, r.Data = nil, h.compactAccepted
	}
	if perr := h.cfg.Conn.PublishMsg(r); perr != nil {
		h.log.Warn("reply failed", "subject", m.Subject, "err", perr)
	}
}

// wantsCompact reports whether the delivery m asked for a compact Accepted
// reply (HeaderAccept). The key is looked up as nats.go stores it
// (canonical), without Header.Get's canonicalisation.
func wantsCompact(m *nats.Msg) bool {
	v := m.Header[HeaderAccept]
	return len(v) == 1 && v[0] == AcceptCompact
}

// replyGrant answers Accepted with the lane's window grant (HeaderWindow):
// the reply to the first leg of a lane's epoch.
func (h *Host) replyGrant(m *nats.Msg, grant int) {
	if h.tracer != nil {
		h.endIntake(m, nil)
	}
	hdr := make(nats.Header, len(h.acceptedHdr)+1)
	for k, v := range h.acceptedHdr {
		hdr[k] = v
	}
	hdr[HeaderWindow] = []string{strconv.Itoa(grant)}
	if perr := h.cfg.Conn.PublishMsg(&nats.Msg{Subject: m.Reply, Header: hdr}); perr != nil {
		h.log.Warn("reply failed", "subject", m.Subject, "err", perr)
	}
}

func (h *Host) refuse(m *nats.Msg, err error) {
	h.refused.Add(1)
	h.refusedBy[verdict.ReasonOf(err)].Add(1)
	h.reply(m, err)
}
