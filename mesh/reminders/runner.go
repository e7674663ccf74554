package reminders

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

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
