package reminders

// What the runner records about the fires it handles: its writes to the
// reminders stream — a schedule repaired after a purge, a failure record
// written or cleared, the end of a one-shot's incarnation, the
// conditional ones on the subject sequence they read
// (nats.ExpectedLastSubjSeqHdr) — its memory of fires it delivered, and
// the keep-alive of a fire under way.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// repairSchedule restores the schedule of the current incarnation inc
// (nil: none) when the server purged it along with an earlier one-shot's:
// nats-server builds a one-shot's fire from the schedule it read, then
// stores it and purges the whole schedule subject (stream.go), so a Set
// whose schedule landed in between is purged too (found by a hostile
// tester: Sets at a one-shot's due instant, and back-to-back Sets of a
// past-due one-shot, returned nil and never fired). It is called for a
// fire that is not current while the schedule subject holds nothing: the
// fire's own production may be what purged it. A one-shot is restored
// only if no fire and no failure of it is in the stream (it has not fired:
// once delivered, its incarnation would have been ended); a repeating
// schedule always. Conditional on the incarnation subject still ending at
// inc (a Set or Cancel meanwhile stands); best effort, logged.
func (r *Runner) repairSchedule(inc *jetstream.RawStreamMsg) {
	if inc == nil {
		return
	}
	addr, name, err := r.s.parseSubject(inc.Subject)
	if err != nil {
		return
	}
	sm := r.s.scheduleOfCopy(addr, name, inc)
	if sm == nil {
		return
	}
	sch, err := parsePattern(inc.Header.Get(HeaderSchedule), inc.Header.Get(HeaderZone))
	if err != nil {
		return
	}
	me := inc.Header.Get(HeaderIncarnation)
	if sch.OneShot() {
		for _, fam := range []string{"f", "x"} {
			m, err := r.s.last(r.ctx, r.s.subject(fam, addr, name))
			if err != nil {
				return // cannot tell: a later fire's handling tries again
			}
			if m != nil && m.Header.Get(HeaderIncarnation) == me && m.Header.Get(HeaderCancelled) == "" {
				return // it fired: its fire or its failure is there
			}
		}
	}
	r.s.expectIncarnation(sm, addr, name, inc.Sequence)
	ctx, cancel := context.WithTimeout(r.ctx, 5*time.Second)
	defer cancel()
	if _, err := r.s.js.PublishMsg(ctx, sm); err != nil {
		r.s.log.Debug("reminder schedule not restored", "address", addr, "name", name, "err", err)
		return
	}
	r.repaired.Add(1)
	r.s.log.Info("reminder schedule restored: the server purged it with an earlier one-shot's fire", "address", addr, "name", name)
}

// clearRetrying removes the failure record of f once f was delivered, if
// the record says f is still retried (a no-placement attempt of this very
// fire): it would keep saying so for its 7 days. A record of another fire,
// or of a failure for good, stays. Conditional on the record read
// (expected last subject sequence); a failure is logged and harmless.
func (r *Runner) clearRetrying(m jetstream.Msg, f Fire) {
	subj := r.s.subject("x", f.Address, f.Name)
	x, err := r.s.last(r.ctx, subj)
	if err != nil || x == nil || x.Header.Get(HeaderRetrying) == "" ||
		x.Header.Get(HeaderIncarnation) != m.Headers().Get(HeaderIncarnation) ||
		x.Header.Get(HeaderDue) != f.Due.UTC().Format(time.RFC3339Nano) {
		return
	}
	t := nats.NewMsg(subj)
	t.Header.Set(HeaderCancelled, "true")
	t.Header.Set(natsRollup, "sub")
	t.Header.Set(natsTTL, TombstoneTTL.String())
	t.Header.Set(nats.ExpectedLastSubjSeqHdr, strconv.FormatUint(x.Sequence, 10))
	ctx, cancel := context.WithTimeout(r.ctx, 5*time.Second)
	defer cancel()
	if _, err := r.s.js.PublishMsg(ctx, t); err != nil {
		r.s.log.Debug("reminder retry record not cleared", "address", f.Address, "name", f.Name, "err", err)
	}
}

// endIncarnation marks the end of a one-shot's incarnation whose schedule
// the server purged (inc: the incarnation subject's message that made its
// fire current; nil: nothing to end): a tombstone, or the same incarnation
// again, expiring after ttl, so the incarnation subject does not outlive
// the reminder. Written only if no Set replaced inc meanwhile (JetStream's
// expected last subject sequence: a conflict means a Set, a Cancel or an
// earlier attempt of this write whose acknowledgement was lost got there
// first, and ends it too). It tries endAttempts times, RetryBase apart, and
// reports whether the incarnation is ended: one left current makes Get
// report the one-shot as still set, although its schedule is gone and
// nothing will fire it (an integration run under a cold compile found a
// delivered one-shot still stored 30 s later).
func (r *Runner) endIncarnation(f Fire, inc *jetstream.RawStreamMsg, ttl time.Duration, tombstone bool) bool {
	if inc == nil {
		return true
	}
	m := nats.NewMsg(inc.Subject)
	if !tombstone {
		m.Header.Set(HeaderIncarnation, inc.Header.Get(HeaderIncarnation))
	}
	m.Header.Set(natsRollup, "sub")
	m.Header.Set(natsTTL, ttl.String())
	m.Header.Set(nats.ExpectedLastSubjSeqHdr, strconv.FormatUint(inc.Sequence, 10))
	var err error
	for attempt := 1; ; attempt++ {
		ctx, cancel := context.WithTimeout(r.ctx, 5*time.Second)
		_, err = r.s.js.PublishMsg(ctx, m)
		cancel()
		var apiErr *jetstream.APIError
		switch {
		case err == nil:
			return true
		case errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence:
			// The subject moved on. Ended, unless it still names this
			// incarnation (a refused Set puts the previous one back at
			// a new sequence: Store.restoreIncarnation): then end that.
			// (JSErrCodeStreamWrongLastSequenceConstant, 10164, is not
			// a mismatch: a write on the subject is still in flight —
			// try again.)
			if !tombstone {
				return true // the same incarnation written again: ours or not, it expires
			}
			ctx, cancel := context.WithTimeout(r.ctx, 5*time.Second)
			cur, gerr := r.s.last(ctx, inc.Subject)
			cancel()
			switch {
			case gerr != nil:
				err = gerr
			case cur == nil || cur.Header.Get(HeaderIncarnation) != inc.Header.Get(HeaderIncarnation) || cur.Header.Get(HeaderCancelled) != "":
				return true
			default:
				m.Header.Set(nats.ExpectedLastSubjSeqHdr, strconv.FormatUint(cur.Sequence, 10))
			}
		}
		if attempt == endAttempts || r.ctx.Err() != nil {
			break
		}
		select {
		case <-r.ctx.Done():
		case <-r.cfg.Clock.After(r.cfg.RetryBase):
		}
	}
	r.s.log.Warn("reminder incarnation not ended: its fire is left to be redelivered", "address", f.Address, "name", f.Name, "err", err)
	return false
}

// incarnation reads the last message of f's reminder's incarnation
// subject (nil: none).
func (r *Runner) incarnation(f Fire) (*jetstream.RawStreamMsg, error) {
	m, err := r.s.last(r.ctx, r.s.subject("i", f.Address, f.Name))
	if err != nil {
		return nil, fmt.Errorf("reminders: read incarnation of %s %s: %w", f.Address, f.Name, err)
	}
	return m, nil
}

// endAttempts is how many times endIncarnation writes before it gives up.
const endAttempts = 3

// markDelivered records that this runner delivered fire id and could not
// end its incarnation: its redelivery here only ends it. Bounded: past
// maxEndsPending the set starts afresh (a fire forgotten is delivered
// again under its ID, which the hub's dedupe answers).
func (r *Runner) markDelivered(id string) {
	r.idsMu.Lock()
	defer r.idsMu.Unlock()
	if len(r.ended) >= maxEndsPending {
		clear(r.ended)
	}
	r.ended[id] = struct{}{}
}

func (r *Runner) deliveredBefore(id string) bool {
	r.idsMu.Lock()
	defer r.idsMu.Unlock()
	_, ok := r.ended[id]
	return ok
}

func (r *Runner) forgetDelivered(id string) {
	r.idsMu.Lock()
	delete(r.ended, id)
	r.idsMu.Unlock()
}

// maxEndsPending bounds the fires a runner remembers it delivered while
// their incarnations could not be ended.
const maxEndsPending = 4096

// keepAlive tells JetStream the fire is still in hand every AckWait/3
// until the returned stop is called.
func (r *Runner) keepAlive(ctx context.Context, m jetstream.Msg) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(r.cfg.AckWait / 3) // real clock: races the server's ack wait
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
				_ = m.InProgress()
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}

func (r *Runner) retry(m jetstream.Msg, f Fire, err error) {
	d := r.cfg.RetryBase
	for i := 1; i < f.Attempt && d < r.cfg.RetryMax; i++ {
		d *= 2
	}
	d = min(d, r.cfg.RetryMax)
	d = time.Duration(float64(d) * (0.8 + 0.4*rand.Float64()))
	_ = m.NakWithDelay(d)
	r.s.log.Debug("reminder fire not delivered; retrying", "address", f.Address, "name", f.Name, "attempt", f.Attempt, "in", d, "err", err)
	r.outcome(f, Retried, err)
}

// fail records a fire that a re-send cannot deliver and drops it.
func (r *Runner) fail(m jetstream.Msg, f Fire, err error) {
	r.s.log.Warn("reminder fire could not be delivered; recorded and dropped",
		"address", f.Address, "name", f.Name, "due", f.Due, "attempt", f.Attempt, "err", err)
	r.record(m, f, err, false)
	_ = m.Term()
	r.outcome(f, Failed, err)
}

// record writes the failure record of f on rem.x (replacing the earlier
// one); retrying marks a fire that is still retried.
func (r *Runner) record(m jetstream.Msg, f Fire, err error, retrying bool) {
	h := m.Headers()
	rec := nats.NewMsg(r.s.subject("x", f.Address, f.Name))
	rec.Data = []byte(err.Error())
	rec.Header.Set(HeaderIncarnation, h.Get(HeaderIncarnation))
	rec.Header.Set(HeaderDue, f.Due.UTC().Format(time.RFC3339Nano))
	rec.Header.Set(HeaderAttempt, strconv.Itoa(f.Attempt))
	for _, k := range []string{HeaderSchedule, HeaderZone, HeaderType, HeaderTracked} {
		if v := h.Get(k); v != "" {
			rec.Header.Set(k, v)
		}
	}
	if retrying {
		rec.Header.Set(HeaderRetrying, "true")
	}
	rec.Header.Set(natsRollup, "sub")
	rec.Header.Set(natsTTL, FailureTTL.String())
	ctx, cancel := context.WithTimeout(r.ctx, 5*time.Second)
	defer cancel()
	if _, perr := r.s.js.PublishMsg(ctx, rec); perr != nil {
		r.s.log.Warn("reminder failure not recorded", "address", f.Address, "name", f.Name, "err", perr)
	}
}
