// Package reminders keeps hubs' durable reminders (DESIGN §13) on
// JetStream message scheduling (nats-server 2.12+, ADR-51): the server
// itself keeps each reminder's time, so a reminder survives its
// activation's collection, its address moving, any node's death and NATS
// server restarts (file storage; three replicas on a cluster).
//
// One stream per mesh prefix ([StreamName]) holds three subject families,
// each with one subject per (address, name), both as subject tokens
// (subjects.EncodeToken):
//
//	<prefix>.rem.s.<address>.<name>   the schedule: one message, rolled up on each Set
//	<prefix>.rem.f.<address>.<name>   fires the server produced from it, not yet delivered
//	<prefix>.rem.x.<address>.<name>   the last fire that could not be delivered, or that found no
//	                                  placement and is still retried (kept 7 days)
//	<prefix>.rem.i.<address>.<name>   the current incarnation: one message, rolled up on each Set,
//	                                  tombstoned (expiring after a day) by a Cancel and once a
//	                                  one-shot's fire was delivered
//
// A Set publishes the schedule message (Nats-Schedule, Nats-Schedule-Target
// naming the fire subject, and the reminder's type, payload and a random
// incarnation in headers and body); the server rolls the subject up, so a
// Set replaces the earlier reminder of that name. When it is due the server
// copies the message onto the fire subject — a one-shot's schedule is
// purged in the same step. A Cancel writes a tombstone onto the schedule
// subject (rolled up, expiring after a day): the server drops the schedule,
// and fires of the cancelled incarnation not yet delivered are dropped. A
// one-shot whose schedule the server purged when it fired is still a
// reminder (Get, List, Cancel) while its fire is pending or its failure is
// recorded.
//
// Which Set a fire belongs to is decided by its incarnation, never by the
// reminder's name: a fire is current while the schedule subject holds its
// incarnation, or — once the server purged a one-shot's schedule — while
// the incarnation subject does. The incarnation subject is written first
// on each Set, so a one-shot replaced by another one-shot that has fired
// too (both schedules purged) cannot make the first one's fire, still
// waiting or retried, current again.
//
// The stream has work-queue retention: a fire leaves it when it is
// acknowledged. Its one durable consumer ([ConsumerName]) is shared by
// every node's [Runner]: each fire goes to one node at a time, which
// delivers it (the mesh's normal sender: placement and single activation
// apply) and acknowledges it only after the delivery was handled. A node
// that dies with a fire in hand leaves it unacknowledged, and JetStream
// redelivers it to another node after the ack wait.
//
// Fires missed while the stream itself was unavailable: a one-shot fires
// once, late; a repeating schedule resumes without catching up (the
// server's rule: it fires at most once for the missed instants).
package reminders

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/subjects"
)

// Headers of the schedule message, copied by the server onto every fire.
const (
	// HeaderSchedule repeats the schedule's pattern (the server strips
	// its own Nats-Schedule from fires).
	HeaderSchedule = "Mesh-Reminder-Schedule"
	// HeaderZone is the cron time zone, if any.
	HeaderZone = "Mesh-Reminder-Zone"
	// HeaderIncarnation names one Set of a reminder: 22 random
	// characters. A fire is delivered only while its incarnation is
	// current, and its delivery ID is derived from it.
	HeaderIncarnation = "Mesh-Reminder-Incarnation"
	// HeaderType is the delivery type of each fire.
	HeaderType = "Mesh-Reminder-Type"
	// HeaderTracked marks a schedule written with its incarnation
	// subject (copied onto its fires): such a fire with neither schedule
	// nor incarnation subject left is not current (its reminder was
	// cancelled, or delivered, and the tombstones expired).
	HeaderTracked = "Mesh-Reminder-Tracked"
	// HeaderCancelled marks a tombstone (a Cancel).
	HeaderCancelled = "Mesh-Reminder-Cancelled"
	// HeaderDue is the due time of a recorded failure (RFC 3339).
	HeaderDue = "Mesh-Reminder-Due"
	// HeaderAttempt is the attempt count of a recorded failure.
	HeaderAttempt = "Mesh-Reminder-Attempt"
	// HeaderRetrying marks a recorded failure whose fire is still
	// retried (no node hosted the address's kind: no placement).
	HeaderRetrying = "Mesh-Reminder-Retrying"
)

// Headers of JetStream's message scheduling (nats-server stream.go).
const (
	natsSchedule       = "Nats-Schedule"
	natsScheduleTarget = "Nats-Schedule-Target"
	natsScheduleTZ     = "Nats-Schedule-Time-Zone"
	natsScheduler      = "Nats-Scheduler"     // on a fire: the schedule's subject
	natsScheduleNext   = "Nats-Schedule-Next" // on a fire: "purge" (one-shot) or the next fire time
	natsRollup         = "Nats-Rollup"
	natsTTL            = "Nats-TTL"
)

// TombstoneTTL is how long a Cancel's tombstone is kept: fires of the
// cancelled incarnation still waiting that long would be delivered.
const TombstoneTTL = 24 * time.Hour

// FailureTTL is how long the record of an undeliverable fire is kept.
const FailureTTL = 7 * 24 * time.Hour

// MaxNameLen bounds a reminder name.
const MaxNameLen = 128

// ConsumerName is the durable consumer the nodes share.
const ConsumerName = "fires"

// StreamName returns the reminders stream of a prefix.
func StreamName(p subjects.Prefix) string {
	if p == "" {
		p = subjects.DefaultPrefix
	}
	return "natsmesh_" + strings.ReplaceAll(string(p), ".", "_") + "_reminders"
}

// Config holds the store's settings. Conn is required; zero fields take
// their documented defaults.
type Config struct {
	// Conn is the node's NATS connection (the node profile: DESIGN §10).
	Conn *nats.Conn
	// Prefix names the stream and its subjects; zero means
	// subjects.DefaultPrefix.
	Prefix subjects.Prefix
	// Replicas of the stream and its consumer, used when this process
	// creates them; zero means 1. Use 3 on a three-server cluster.
	Replicas int
	// PlacementCluster places a stream this process creates in that NATS
	// cluster (DESIGN §12); empty: the server's default.
	PlacementCluster string
	// MemoryStorage keeps the stream in memory (tests only: reminders
	// then do not survive the NATS servers).
	MemoryStorage bool
	// Logger; nil means slog.Default().
	Logger *slog.Logger
}

// Store is a handle on the reminders stream. Safe for concurrent use.
type Store struct {
	js     jetstream.JetStream
	stream jetstream.Stream
	prefix subjects.Prefix
	name   string
	base   string // "<prefix>.rem."
	maxPay int
	log    *slog.Logger
	cfg    Config
}

// Open binds the reminders stream, creating it if absent (work-queue
// retention, message schedules and per-message TTLs allowed, file storage,
// Config.Replicas). It blocks until the stream is bound or ctx ends. Errors
// match ErrInvalidConfig, or are JetStream's.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	if cfg.Conn == nil {
		return nil, fmt.Errorf("%w: Conn is nil", ErrInvalidConfig)
	}
	if cfg.Replicas < 0 {
		return nil, fmt.Errorf("%w: negative Replicas", ErrInvalidConfig)
	}
	if cfg.Replicas == 0 {
		cfg.Replicas = 1
	}
	if cfg.Prefix == "" {
		cfg.Prefix = subjects.DefaultPrefix
	}
	if err := cfg.Prefix.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	js, err := jetstream.New(cfg.Conn)
	if err != nil {
		return nil, err
	}
	s := &Store{js: js, prefix: cfg.Prefix, name: StreamName(cfg.Prefix), base: cfg.Prefix.Sub("rem."), log: cfg.Logger, cfg: cfg}
	storage := jetstream.FileStorage
	if cfg.MemoryStorage {
		storage = jetstream.MemoryStorage
	}
	scfg := jetstream.StreamConfig{
		Name:              s.name,
		Description:       "natsmesh durable reminders",
		Placement:         placement(cfg.PlacementCluster),
		Subjects:          s.streamSubjects(),
		Retention:         jetstream.WorkQueuePolicy,
		Storage:           storage,
		Replicas:          cfg.Replicas,
		Discard:           jetstream.DiscardOld,
		AllowMsgSchedules: true,
		AllowMsgTTL:       true,
		AllowRollup:       true,
		AllowDirect:       true,
	}
	st, err := js.Stream(ctx, s.name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		st, err = js.CreateStream(ctx, scfg)
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			st, err = js.Stream(ctx, s.name)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("reminders: stream %s: %w", s.name, err)
	}
	if !st.CachedInfo().Config.AllowMsgSchedules {
		return nil, fmt.Errorf("%w: stream %s exists without AllowMsgSchedules", ErrInvalidConfig, s.name)
	}
	if have := st.CachedInfo().Config; !slices.Contains(have.Subjects, s.base+"i.*.*") {
		// A stream an earlier version created: add the incarnation
		// subjects (a stream's subjects may grow in place).
		have.Subjects = append(slices.Clone(have.Subjects), s.base+"i.*.*")
		if st, err = js.UpdateStream(ctx, have); err != nil {
			return nil, fmt.Errorf("reminders: stream %s: add the incarnation subjects: %w", s.name, err)
		}
	}
	s.stream = st
	s.maxPay = int(cfg.Conn.MaxPayload()) - 4096
	return s, nil
}

// Reminder is one reminder of an address.
type Reminder struct {
	// Address receives the fires. Required.
	Address subjects.Address `json:"address"`
	// Name names the reminder within its address: 1-128 bytes of
	// printable ASCII without spaces. Required.
	Name string `json:"name"`
	// Schedule says when it fires. Required.
	Schedule Schedule `json:"schedule"`
	// Type is the delivery type of each fire (at most 256 bytes); the
	// hub tells fires apart by it and by hub.Delivery.Reminder.
	Type string `json:"type,omitempty"`
	// Payload travels with each fire, limited by the server's
	// max_payload less 4 KiB.
	Payload []byte `json:"payload,omitempty"`

	// Set is when the reminder was stored: the server's timestamp in Get
	// and List, this process's clock in what Set returns.
	Set time.Time `json:"set,omitzero"`
	// Revision is the stream sequence of the schedule message; filled by
	// Set, Get and List.
	Revision uint64 `json:"revision,omitempty"`
	// LastFailure is the last fire of this reminder that could not be
	// delivered (a failure the sender may not resend, or no placement:
	// see Failure.Retrying), if recorded within FailureTTL; filled by Get
	// and List.
	LastFailure *Failure `json:"last_failure,omitempty"`
	// Pending is the fire of this reminder the server produced and no
	// node has delivered yet (the last one, if several), if any; filled
	// by Get and List.
	Pending *PendingFire `json:"pending_fire,omitempty"`

	incarnation string
}

// Failure is a recorded fire that could not be delivered.
type Failure struct {
	Due   time.Time `json:"due"`
	At    time.Time `json:"at"`
	Error string    `json:"error"`
	// Attempt is the attempt that failed (JetStream's delivery count).
	Attempt int `json:"attempt,omitempty"`
	// Retrying: the fire is still retried with back-off (no node hosted
	// the address's kind after the placement wait); otherwise it was
	// dropped.
	Retrying bool `json:"retrying,omitempty"`
}

// PendingFire is a fire produced by the server and not yet delivered:
// waiting for a runner, being delivered, or retried with back-off.
type PendingFire struct {
	// Due is when the fire was due.
	Due time.Time `json:"due"`
	// Retried is how many times its delivery was retried, as far as
	// recorded: the runner records the retries of a fire that found no
	// placement (see Failure.Retrying); zero otherwise.
	Retried int `json:"retried,omitempty"`
}

// ValidateName checks a reminder name: 1-[MaxNameLen] bytes of printable
// ASCII without spaces. The error matches ErrInvalidReminder.
func ValidateName(name string) error {
	if name == "" || len(name) > MaxNameLen {
		return fmt.Errorf("%w: name must be 1-%d bytes (got %d)", ErrInvalidReminder, MaxNameLen, len(name))
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c < 0x21 || c > 0x7e {
			return fmt.Errorf("%w: name must be printable ASCII without spaces: byte %d is %#02x", ErrInvalidReminder, i, c)
		}
	}
	return nil
}

// streamSubjects are the stream's four subject families.
func (s *Store) streamSubjects() []string {
	return []string{s.base + "s.*.*", s.base + "f.*.*", s.base + "x.*.*", s.base + "i.*.*"}
}

func (s *Store) subject(family string, addr subjects.Address, name string) string {
	return s.base + family + "." + subjects.EncodeToken(string(addr)) + "." + subjects.EncodeToken(name)
}

// parseSubject reads (address, name) from a subject of the stream.
func (s *Store) parseSubject(subj string) (subjects.Address, string, error) {
	rest, ok := strings.CutPrefix(subj, s.base)
	if !ok || len(rest) < 2 || rest[1] != '.' {
		return "", "", fmt.Errorf("reminders: subject %q is not the stream's", subj)
	}
	at, nt, ok := strings.Cut(rest[2:], ".")
	if !ok {
		return "", "", fmt.Errorf("reminders: subject %q is not the stream's", subj)
	}
	a, err := subjects.DecodeToken(at)
	if err != nil {
		return "", "", err
	}
	n, err := subjects.DecodeToken(nt)
	if err != nil {
		return "", "", err
	}
	return subjects.Address(a), n, nil
}

// Set stores r, replacing the reminder of that name at that address (and
// dropping the replaced one's fires not yet delivered). It returns once the
// stream acknowledged the write at its replication, with Revision set. It
// blocks for two JetStream publishes (the incarnation, then the schedule),
// bounded by ctx. Errors match ErrInvalidReminder (nothing written), ErrNoStore, or are
// JetStream's: then the Set may have taken effect in part (the replaced
// reminder's waiting one-shot fire dropped, its schedule kept) — set it
// again. Safe for concurrent use, from any goroutine, a hub's turn
// included.
func (s *Store) Set(ctx context.Context, r Reminder) (Reminder, error) {
	if s == nil {
		return r, ErrNoStore
	}
	if err := r.Address.Validate(); err != nil {
		return r, fmt.Errorf("%w: %w", ErrInvalidReminder, err)
	}
	if err := ValidateName(r.Name); err != nil {
		return r, err
	}
	if len(r.Type) > hub.MaxTypeLen || strings.ContainsAny(r.Type, "\r\n") {
		return r, fmt.Errorf("%w: type over %d bytes or with a line break", ErrInvalidReminder, hub.MaxTypeLen)
	}
	if len(r.Payload) > s.maxPay {
		return r, fmt.Errorf("%w: payload of %d bytes over %d", ErrInvalidReminder, len(r.Payload), s.maxPay)
	}
	pat, err := r.Schedule.pattern()
	if err != nil {
		return r, err
	}
	r.incarnation = nuid.Next()
	sched := s.scheduleMsg(r, pat)
	// What the incarnation subject held, to restore should the server
	// refuse the schedule (a cron field it does not take).
	prev, err := s.last(ctx, s.subject("i", r.Address, r.Name))
	if err != nil {
		return r, fmt.Errorf("reminders: set %s %s: %w", r.Address, r.Name, err)
	}
	// The incarnation first — a copy of the schedule without its
	// Nats-Schedule headers: from here on no fire of an earlier Set is
	// current once its schedule is gone, and a runner can restore this
	// schedule should the server purge it (Runner: repairSchedule).
	// Should the schedule's publish then fail, the earlier reminder's
	// schedule (if any) still fires; a one-shot's fire already produced
	// is dropped (the error says the Set may have taken effect: set it
	// again).
	iseq, err := s.writeCopy(ctx, sched)
	if err != nil {
		return r, fmt.Errorf("reminders: set %s %s: %w", r.Address, r.Name, err)
	}
	s.expectIncarnation(sched, r.Address, r.Name, iseq)
	ack, err := s.js.PublishMsg(ctx, sched)
	if err != nil {
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) && apiErr.ErrorCode == errCodeSchedulePatternInvalid {
			// Refused for good: put back what the incarnation subject
			// held (only while it still ends at our write), so nothing
			// of this Set stands.
			s.restoreIncarnation(ctx, r.Address, r.Name, prev, iseq)
			return r, fmt.Errorf("%w: the server refuses schedule %q: %w", ErrInvalidReminder, pat, err)
		}
		return r, fmt.Errorf("reminders: set %s %s: %w", r.Address, r.Name, concurrent(err))
	}
	r.Revision = ack.Sequence
	r.Set = time.Now().UTC() // real clock: beside the server's schedule times
	return r, nil
}

// errCodeSchedulePatternInvalid is JetStream's "message schedules pattern
// is invalid".
const errCodeSchedulePatternInvalid jetstream.ErrorCode = 10189

// scheduleMsg is the schedule message of r with pattern pat.
func (s *Store) scheduleMsg(r Reminder, pat string) *nats.Msg {
	m := nats.NewMsg(s.subject("s", r.Address, r.Name))
	m.Data = r.Payload
	m.Header.Set(natsSchedule, pat)
	m.Header.Set(natsScheduleTarget, s.subject("f", r.Address, r.Name))
	if r.Schedule.TimeZone != "" {
		m.Header.Set(natsScheduleTZ, r.Schedule.TimeZone)
		m.Header.Set(HeaderZone, r.Schedule.TimeZone)
	}
	m.Header.Set(HeaderSchedule, pat)
	m.Header.Set(HeaderIncarnation, r.incarnation)
	m.Header.Set(HeaderTracked, "1")
	if r.Type != "" {
		m.Header.Set(HeaderType, r.Type)
	}
	return m
}

// copyHeaders are the schedule message's headers the incarnation subject
// keeps (everything but JetStream's own).
var copyHeaders = []string{HeaderSchedule, HeaderZone, HeaderIncarnation, HeaderTracked, HeaderType}

// writeCopy writes the incarnation of schedule message m — a copy of it
// without JetStream's scheduling headers — on its incarnation subject and
// returns its stream sequence.
func (s *Store) writeCopy(ctx context.Context, m *nats.Msg) (uint64, error) {
	addr, name, err := s.parseSubject(m.Subject)
	if err != nil {
		return 0, err
	}
	c := nats.NewMsg(s.subject("i", addr, name))
	c.Data = m.Data
	for _, k := range copyHeaders {
		if v := m.Header.Get(k); v != "" {
			c.Header.Set(k, v)
		}
	}
	c.Header.Set(natsRollup, "sub")
	ack, err := s.js.PublishMsg(ctx, c)
	if err != nil {
		return 0, err
	}
	return ack.Sequence, nil
}

// scheduleOfCopy rebuilds the schedule message from incarnation message c
// (writeCopy): nil if c holds no schedule (a tombstone, or written before
// copies carried one).
func (s *Store) scheduleOfCopy(addr subjects.Address, name string, c *jetstream.RawStreamMsg) *nats.Msg {
	pat := c.Header.Get(HeaderSchedule)
	if pat == "" || c.Header.Get(HeaderIncarnation) == "" {
		return nil
	}
	m := nats.NewMsg(s.subject("s", addr, name))
	m.Data = c.Data
	m.Header.Set(natsSchedule, pat)
	m.Header.Set(natsScheduleTarget, s.subject("f", addr, name))
	if z := c.Header.Get(HeaderZone); z != "" {
		m.Header.Set(natsScheduleTZ, z)
	}
	for _, k := range copyHeaders {
		if v := c.Header.Get(k); v != "" {
			m.Header.Set(k, v)
		}
	}
	return m
}

// restoreIncarnation puts prev (nil: nothing, written as an expiring
// tombstone) back on the incarnation subject of (addr, name), only while
// the subject still ends at seq. Best effort: a failure leaves this Set's
// incarnation, which names no schedule (Get shows it not).
func (s *Store) restoreIncarnation(ctx context.Context, addr subjects.Address, name string, prev *jetstream.RawStreamMsg, seq uint64) {
	m := nats.NewMsg(s.subject("i", addr, name))
	m.Header.Set(natsRollup, "sub")
	if prev != nil {
		m.Data = prev.Data
		for k, vs := range prev.Header {
			if !strings.HasPrefix(k, "Nats-") {
				m.Header[k] = vs
			}
		}
		if ttl := prev.Header.Get(natsTTL); ttl != "" {
			m.Header.Set(natsTTL, ttl)
		}
	} else {
		m.Header.Set(HeaderCancelled, "true")
		m.Header.Set(natsTTL, TombstoneTTL.String())
	}
	m.Header.Set(nats.ExpectedLastSubjSeqHdr, strconv.FormatUint(seq, 10))
	if _, err := s.js.PublishMsg(ctx, m); err != nil {
		s.log.Warn("reminder incarnation not restored after a refused Set", "address", addr, "name", name, "err", err)
	}
}

// Cancel removes the reminder name of addr — a schedule, a fire not yet
// delivered (a one-shot's, whose schedule the server purged when it
// fired), or only a recorded failure: it fires no more, its fires not yet
// delivered are dropped (one whose delivery is already under way
// completes) and its failure record is cleared. It blocks for the reads of
// Get and up to three JetStream publishes, bounded by ctx. Errors match ErrNoStore,
// ErrNotFound (nothing to cancel), ErrInvalidReminder, or are JetStream's.
func (s *Store) Cancel(ctx context.Context, addr subjects.Address, name string) error {
	if s == nil {
		return ErrNoStore
	}
	r, err := s.Get(ctx, addr, name)
	if err != nil {
		return err
	}
	// The incarnation's tombstone first, then the schedule's, only while
	// the incarnation subject still holds that tombstone (as Set writes
	// its schedule only while it holds its incarnation): of a Cancel and a
	// Set that race, the one whose incarnation write came last stands, and
	// the schedule subject never disagrees with the incarnation subject.
	iseq, err := s.writeTombstone(ctx, addr, name)
	if err != nil {
		return fmt.Errorf("reminders: cancel %s %s: %w", addr, name, err)
	}
	families := []string{"s"}
	if r.LastFailure != nil {
		families = append(families, "x")
	}
	for _, fam := range families {
		m := nats.NewMsg(s.subject(fam, addr, name))
		m.Header.Set(HeaderCancelled, "true")
		m.Header.Set(natsRollup, "sub")
		m.Header.Set(natsTTL, TombstoneTTL.String())
		s.expectIncarnation(m, addr, name, iseq)
		if _, err := s.js.PublishMsg(ctx, m); err != nil {
			return fmt.Errorf("reminders: cancel %s %s: %w", addr, name, concurrent(err))
		}
	}
	return nil
}

// writeTombstone writes a Cancel's tombstone (expiring after
// TombstoneTTL) on the incarnation subject of (addr, name) and returns its
// stream sequence.
func (s *Store) writeTombstone(ctx context.Context, addr subjects.Address, name string) (uint64, error) {
	m := nats.NewMsg(s.subject("i", addr, name))
	m.Header.Set(natsRollup, "sub")
	m.Header.Set(HeaderCancelled, "true")
	m.Header.Set(natsTTL, TombstoneTTL.String())
	ack, err := s.js.PublishMsg(ctx, m)
	if err != nil {
		return 0, err
	}
	return ack.Sequence, nil
}

// expectIncarnation makes the publish of m conditional on the incarnation
// subject of (addr, name) still ending at seq (JetStream's expected last
// subject sequence, checked on that other subject).
func (s *Store) expectIncarnation(m *nats.Msg, addr subjects.Address, name string, seq uint64) {
	m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(seq, 10))
	m.Header.Set(jetstream.ExpectedLastSubjSeqSubjHeader, s.subject("i", addr, name))
}

// concurrent maps JetStream's wrong-last-sequence refusal of a conditional
// write to ErrConcurrent.
func concurrent(err error) error {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant) {
		return fmt.Errorf("%w: %w", ErrConcurrent, err)
	}
	return err
}

// placement returns the JetStream placement in cluster, nil when empty.
func placement(cluster string) *jetstream.Placement {
	if cluster == "" {
		return nil
	}
	return &jetstream.Placement{Cluster: cluster}
}
