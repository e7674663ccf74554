package reminders

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsmesh/natsmesh/internal/clock"
	"github.com/natsmesh/natsmesh/verdict"
)

// Deliverer delivers one fire and returns nil once it was handled. An
// error is judged with package verdict: a transient failure (or Ignored:
// an overloaded hub) is retried with back-off, anything else is recorded
// and the fire dropped. ctx ends at RunConfig.Timeout or when the runner
// stops. It is called on its own goroutine, up to RunConfig.Concurrency at
// once.
type Deliverer func(ctx context.Context, f Fire) error

// RunConfig holds a Runner's settings. Deliver is required.
type RunConfig struct {
	// Deliver delivers each fire. Required.
	Deliver Deliverer
	// Concurrency bounds fires delivered at once by this runner; zero
	// means DefaultConcurrency.
	Concurrency int
	// Timeout bounds one delivery attempt; zero means DefaultTimeout.
	Timeout time.Duration
	// AckWait is the consumer's ack wait: how long a fire in the hands of
	// a runner that went silent (its node died) waits before another
	// runner gets it. While a delivery is under way the runner extends it
	// every AckWait/3. Zero means DefaultAckWait. The first runner
	// creates the consumer; later ones update it to their AckWait.
	AckWait time.Duration
	// RetryBase and RetryMax bound the back-off before a fire whose
	// delivery failed transiently is tried again: RetryBase doubling per
	// attempt up to RetryMax, with ±20 % jitter. Zero means 1 s and 60 s.
	RetryBase, RetryMax time.Duration
	// OnOutcome, if set, is called after each attempt with the fire and
	// what became of it (tests, metrics). It must not block.
	OnOutcome func(f Fire, o Outcome, err error)
	// Clock times the runner's own waits (the RetryBase apart attempts
	// to end a reminder's incarnation); nil means the real clock. The
	// AckWait/3 progress ticks stay on the real clock: they race the
	// server's ack wait, which is real time.
	Clock clock.Clock
}

// Defaults of RunConfig.
const (
	DefaultConcurrency = 256
	DefaultTimeout     = 30 * time.Second
	DefaultAckWait     = 10 * time.Second
)

// Outcome is what became of one attempt of a fire.
type Outcome int

const (
	// Delivered: handled; acknowledged.
	Delivered Outcome = iota
	// Dropped: the reminder was cancelled or replaced since the fire was
	// produced; acknowledged without delivery.
	Dropped
	// Retried: a transient failure; the fire is redelivered after a
	// back-off.
	Retried
	// Failed: a failure that a re-send cannot cure; recorded (see
	// Reminder.LastFailure), logged and acknowledged.
	Failed
	// Abandoned: the runner stopped with the delivery under way; the fire
	// is handed back at once for another runner.
	Abandoned
)

func (o Outcome) String() string {
	switch o {
	case Delivered:
		return "delivered"
	case Dropped:
		return "dropped"
	case Retried:
		return "retried"
	case Failed:
		return "failed"
	default:
		return "abandoned"
	}
}

// RunnerStats are a runner's counters since it started.
type RunnerStats struct {
	Delivered int64 `json:"delivered"`
	Dropped   int64 `json:"dropped"`
	Retried   int64 `json:"retried"`
	Failed    int64 `json:"failed"`
	InFlight  int64 `json:"in_flight"`
	// Repaired counts schedules restored after the server purged them
	// with an earlier one-shot's fire (repairSchedule).
	Repaired int64 `json:"repaired"`
}

// Runner takes fires from the shared consumer and delivers them. Stop it
// with Stop. Safe for concurrent use.
type Runner struct {
	s      *Store
	cfg    RunConfig
	cc     jetstream.ConsumeContext
	sem    chan struct{}
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once
	done   chan struct{}

	counts   [5]atomic.Int64
	inFlight atomic.Int64
	repaired atomic.Int64

	idsMu sync.Mutex
	ids   map[string]struct{} // fires being delivered by this runner, by ID
	ended map[string]struct{} // fires delivered here whose incarnation is still to be ended (markDelivered)
}

// Run creates or updates the shared durable consumer and starts taking
// fires from it. It blocks for the consumer's creation, bounded by ctx;
// the runner then runs until Stop. Errors match ErrInvalidConfig, ErrNoStore, or are
// JetStream's.
func (s *Store) Run(ctx context.Context, cfg RunConfig) (*Runner, error) {
	if s == nil {
		return nil, ErrNoStore
	}
	if cfg.Deliver == nil {
		return nil, fmt.Errorf("%w: Deliver is nil", ErrInvalidConfig)
	}
	if cfg.Concurrency < 0 || cfg.Timeout < 0 || cfg.AckWait < 0 || cfg.RetryBase < 0 || cfg.RetryMax < 0 {
		return nil, fmt.Errorf("%w: negative setting", ErrInvalidConfig)
	}
	if cfg.Concurrency == 0 {
		cfg.Concurrency = DefaultConcurrency
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.AckWait == 0 {
		cfg.AckWait = DefaultAckWait
	}
	cfg.Clock = clock.Or(cfg.Clock)
	if cfg.RetryBase == 0 {
		cfg.RetryBase = time.Second
	}
	if cfg.RetryMax == 0 {
		cfg.RetryMax = time.Minute
	}
	cons, err := s.stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable:       ConsumerName,
		Description:   "natsmesh reminder fires, shared by the nodes",
		FilterSubject: s.base + "f.>",
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       cfg.AckWait,
		MaxDeliver:    -1,
		MaxAckPending: 100_000,
		// Replicas zero: the stream's.
	})
	if err != nil {
		// An update the server refuses (another node's settings): the
		// existing consumer serves as it is.
		var uerr error
		if cons, uerr = s.stream.Consumer(ctx, ConsumerName); uerr != nil {
			return nil, fmt.Errorf("reminders: consumer %s: %w", ConsumerName, err)
		}
		s.log.Warn("reminder consumer kept its existing settings", "consumer", ConsumerName, "err", err)
	}
	r := &Runner{s: s, cfg: cfg, sem: make(chan struct{}, cfg.Concurrency), done: make(chan struct{}), ids: map[string]struct{}{}, ended: map[string]struct{}{}}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	cc, err := cons.Consume(r.take, jetstream.PullMaxMessages(cfg.Concurrency),
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			if !errors.Is(err, jetstream.ErrNoHeartbeat) {
				s.log.Debug("reminder consumer", "err", err)
			}
		}))
	if err != nil {
		r.cancel()
		return nil, fmt.Errorf("reminders: consume: %w", err)
	}
	r.cc = cc
	return r, nil
}

// Stop stops taking fires, ends the deliveries under way (each fire is
// handed back for another runner: Abandoned) and waits for them. Safe to
// call more than once.
func (r *Runner) Stop() {
	r.once.Do(func() {
		r.cc.Stop()
		r.cancel()
		r.wg.Wait()
		close(r.done)
	})
}

// Done is closed once Stop returned.
func (r *Runner) Done() <-chan struct{} { return r.done }

// Stats returns the runner's counters.
func (r *Runner) Stats() RunnerStats {
	return RunnerStats{
		Delivered: r.counts[Delivered].Load(), Dropped: r.counts[Dropped].Load(),
		Retried: r.counts[Retried].Load(), Failed: r.counts[Failed].Load(), InFlight: r.inFlight.Load(),
		Repaired: r.repaired.Load(),
	}
}

// take runs on the consume callback: it waits for a slot (back-pressure
// on the pull) and hands the fire to a goroutine.
func (r *Runner) take(m jetstream.Msg) {
	select {
	case r.sem <- struct{}{}:
	case <-r.ctx.Done():
		_ = m.Nak()
		return
	}
	r.wg.Add(1)
	r.inFlight.Add(1)
	go func() {
		defer func() {
			r.inFlight.Add(-1)
			<-r.sem
			r.wg.Done()
		}()
		r.handle(m)
	}()
}

func (r *Runner) outcome(f Fire, o Outcome, err error) {
	if o != Abandoned {
		r.counts[o].Add(1)
	}
	if cb := r.cfg.OnOutcome; cb != nil {
		cb(f, o, err)
	}
}

func (r *Runner) handle(m jetstream.Msg) {
	f, sched, err := r.fire(m)
	if err != nil {
		// Not a fire this version can read: nothing will ever deliver it.
		r.s.log.Warn("reminder fire unreadable; dropped", "subject", m.Subject(), "err", err)
		_ = m.Term()
		r.outcome(f, Failed, err)
		return
	}
	// Is the fire's incarnation still current? A Cancel or a later Set
	// moved the schedule subject on: drop the fire. A one-shot's fire
	// purged its schedule: then the incarnation subject says (a later
	// one-shot may have fired and purged its own schedule since).
	var inc *jetstream.RawStreamMsg // the incarnation subject's message, when it was read
	cur, err := r.s.stream.GetLastMsgForSubject(r.ctx, sched)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		if !f.Schedule.OneShot() {
			_ = m.Ack() // a repeating schedule purged by hand
			r.outcome(f, Dropped, nil)
			return
		}
		if inc, err = r.incarnation(f); err != nil {
			r.retry(m, f, err)
			return
		}
		if !currentWithoutSchedule(m.Headers(), inc) {
			r.repairSchedule(inc)
			_ = m.Ack()
			r.outcome(f, Dropped, nil)
			return
		}
	case err != nil:
		r.retry(m, f, fmt.Errorf("reminders: read schedule %s: %w", sched, err))
		return
	case cur.Header.Get(HeaderIncarnation) != m.Headers().Get(HeaderIncarnation):
		_ = m.Ack()
		r.outcome(f, Dropped, nil)
		return
	case f.Schedule.OneShot():
		// A one-shot's fire read before the server purged its schedule
		// (it publishes the fire, then purges): its incarnation is ended
		// after the delivery all the same, or once the purge lands Get
		// finds the incarnation's copy and reports the one-shot as still
		// set (found under a cold compile: a delivered one-shot stored
		// 30 s later). Only this fire's incarnation: a Set landing
		// between the two reads is left alone.
		i, err := r.incarnation(f)
		if err != nil {
			r.retry(m, f, err)
			return
		}
		if i != nil && i.Header.Get(HeaderIncarnation) == m.Headers().Get(HeaderIncarnation) {
			inc = i
		}
	}
	// A fire redelivered while this runner still delivers it (its ack
	// wait passed regardless of the keep-alive): leave it to the first.
	r.idsMu.Lock()
	_, busy := r.ids[f.ID]
	if !busy {
		r.ids[f.ID] = struct{}{}
	}
	r.idsMu.Unlock()
	if busy {
		_ = m.NakWithDelay(r.cfg.RetryBase)
		return
	}
	defer func() {
		r.idsMu.Lock()
		delete(r.ids, f.ID)
		r.idsMu.Unlock()
	}()
	// The fire stays in hand (JetStream's ack wait kept from running out)
	// until it is acknowledged or handed back: also while its
	// incarnation is ended after the delivery, which may take longer
	// than the ack wait — else another runner would deliver it again
	// meanwhile.
	stopTicks := r.keepAlive(r.ctx, m)
	defer stopTicks()
	if r.deliveredBefore(f.ID) {
		err = nil // delivered by this runner already; only its ending was left
	} else {
		ctx, cancel := context.WithTimeout(r.ctx, r.cfg.Timeout)
		err = r.cfg.Deliver(ctx, f)
		cancel()
	}
	switch {
	case err == nil:
		// A one-shot's incarnation ends with its delivery: a tombstone
		// before the ack, so a redelivery after a lost ack is dropped.
		if !r.endIncarnation(f, inc, TombstoneTTL, true) {
			// Not acknowledged: JetStream redelivers the fire after a
			// back-off, and this runner then only ends the incarnation
			// (deliveredBefore; on another runner, the fire's ID
			// dedupes the delivery at the hub).
			r.markDelivered(f.ID)
			r.retry(m, f, errors.New("delivered, but its incarnation could not be ended: left to be redelivered"))
			return
		}
		r.forgetDelivered(f.ID)
		if f.Attempt > 1 {
			r.clearRetrying(m, f)
		}
		if aerr := m.DoubleAck(r.ctx); aerr != nil && r.ctx.Err() == nil {
			// The fire will be redelivered; its ID dedupes it.
			r.s.log.Debug("reminder fire ack", "id", f.ID, "err", aerr)
		}
		r.outcome(f, Delivered, nil)
	case r.ctx.Err() != nil:
		_ = m.Nak()
		r.outcome(f, Abandoned, err)
	case errors.Is(err, verdict.ErrNoPlacement):
		// No node hosts the kind, after the client's placement wait: a
		// node of that kind may yet come, so retried like any transient
		// failure — but recorded, so list shows why it waits.
		r.record(m, f, err, true)
		r.retry(m, f, err)
	case verdict.IsTransient(err) || verdict.Classify(err) == verdict.Ignored:
		r.retry(m, f, err)
	default:
		r.fail(m, f, err)
		// Kept while its failure record is: it makes the record current.
		r.endIncarnation(f, inc, FailureTTL, false)
	}
}

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
