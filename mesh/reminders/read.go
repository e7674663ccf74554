package reminders

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsmesh/natsmesh/subjects"
)

// Get returns the reminder name of addr: its current schedule, or — once
// a one-shot's schedule is gone (the server purges it when it fires) — a
// fire of it not yet delivered (Pending), or else its recorded failure
// (LastFailure); Schedule, Type and Payload then come from that fire (the
// record carries no payload) and Set and Revision are zero. It blocks for
// up to four direct gets, bounded by ctx. Errors match ErrNoStore, ErrNotFound (never
// set, cancelled, or a one-shot that fired, was delivered and left no
// failure), ErrInvalidReminder, or are JetStream's.
func (s *Store) Get(ctx context.Context, addr subjects.Address, name string) (Reminder, error) {
	if s == nil {
		return Reminder{}, ErrNoStore
	}
	if err := addr.Validate(); err != nil {
		return Reminder{}, fmt.Errorf("%w: %w", ErrInvalidReminder, err)
	}
	if err := ValidateName(name); err != nil {
		return Reminder{}, err
	}
	return s.find(ctx, addr, name)
}

// last returns the last message of subj, or nil.
func (s *Store) last(ctx context.Context, subj string) (*jetstream.RawStreamMsg, error) {
	m, err := s.stream.GetLastMsgForSubject(ctx, subj)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, nil
	}
	return m, err
}

// find reads the reminder name of addr from its three subjects (see Get).
func (s *Store) find(ctx context.Context, addr subjects.Address, name string) (Reminder, error) {
	notFound := fmt.Errorf("%w: %s %s", ErrNotFound, addr, name)
	var r Reminder
	found := false
	sm, err := s.last(ctx, s.subject("s", addr, name))
	if err != nil {
		return Reminder{}, err
	}
	if sm != nil {
		if sm.Header.Get(HeaderCancelled) != "" || sm.Header.Get(natsSchedule) == "" {
			return Reminder{}, notFound // cancelled: its waiting fires are dropped
		}
		sch, err := parsePattern(sm.Header.Get(natsSchedule), sm.Header.Get(natsScheduleTZ))
		if err != nil {
			return Reminder{}, err
		}
		r = Reminder{Address: addr, Name: name, Schedule: sch, Type: sm.Header.Get(HeaderType), Payload: sm.Data,
			Set: sm.Time.UTC(), Revision: sm.Sequence, incarnation: sm.Header.Get(HeaderIncarnation)}
		found = true
	}
	var im *jetstream.RawStreamMsg // read only once a schedule is gone
	imRead := false
	copyCurrent := func(h nats.Header) (bool, error) {
		if found {
			return h.Get(HeaderIncarnation) == r.incarnation, nil
		}
		if !imRead {
			if im, err = s.last(ctx, s.subject("i", addr, name)); err != nil {
				return false, err
			}
			imRead = true
		}
		return currentWithoutSchedule(h, im), nil
	}
	fm, err := s.last(ctx, s.subject("f", addr, name))
	if err != nil {
		return Reminder{}, err
	}
	fcur := false
	if fm != nil {
		if fcur, err = copyCurrent(fm.Header); err != nil {
			return Reminder{}, err
		}
	}
	if fcur {
		if !found {
			if r, err = fromCopy(addr, name, fm.Header, fm.Data); err != nil {
				return Reminder{}, err
			}
			found = true
		}
		sch, _ := parsePattern(fm.Header.Get(HeaderSchedule), fm.Header.Get(HeaderZone))
		due, _ := fireDue(sch, fm.Header.Get(natsScheduleNext), fm.Time)
		r.Pending = &PendingFire{Due: due.UTC()}
	}
	xm, err := s.last(ctx, s.subject("x", addr, name))
	if err != nil {
		return Reminder{}, err
	}
	xcur := false
	if xm != nil && xm.Header.Get(HeaderCancelled) == "" {
		if xcur, err = copyCurrent(xm.Header); err != nil {
			return Reminder{}, err
		}
	}
	if xcur {
		if !found {
			if r, err = fromCopy(addr, name, xm.Header, nil); err != nil {
				return Reminder{}, err
			}
			found = true
		}
		due, _ := time.Parse(time.RFC3339Nano, xm.Header.Get(HeaderDue))
		attempt, _ := strconv.Atoi(xm.Header.Get(HeaderAttempt))
		r.LastFailure = &Failure{Due: due, At: xm.Time.UTC(), Error: string(xm.Data), Attempt: attempt,
			Retrying: xm.Header.Get(HeaderRetrying) != ""}
		if r.Schedule == (Schedule{}) {
			r.Schedule = At(due) // a record written before records carried the schedule
		}
		if r.Pending != nil && r.LastFailure.Retrying && r.Pending.Due.Equal(due) && attempt > 0 {
			r.Pending.Retried = attempt
		}
	}
	if !found {
		// No schedule, fire or record: a Set whose schedule the server
		// purged with an earlier one-shot's fire (the runner restores it
		// when it drops that fire: Runner.repairSchedule) is still the
		// reminder its incarnation's copy names.
		if !imRead {
			if im, err = s.last(ctx, s.subject("i", addr, name)); err != nil {
				return Reminder{}, err
			}
		}
		if im != nil && s.scheduleOfCopy(addr, name, im) != nil {
			if r, err = fromCopy(addr, name, im.Header, im.Data); err != nil {
				return Reminder{}, err
			}
			r.Set = im.Time.UTC()
			return r, nil
		}
		return Reminder{}, notFound
	}
	return r, nil
}

// currentWithoutSchedule reports whether a fire or failure record with
// headers h is of the current incarnation when the schedule subject holds
// nothing (a one-shot's, purged by the server when it fired): im, the
// incarnation subject's message (nil: none), names it. A copy of a schedule
// written before incarnation subjects existed (no HeaderTracked) is taken
// as current, as that version did, unless the incarnation subject holds
// anything: then a Set or Cancel of this version came after it.
func currentWithoutSchedule(h nats.Header, im *jetstream.RawStreamMsg) bool {
	if h.Get(HeaderTracked) == "" {
		return im == nil
	}
	return im != nil && im.Header.Get(HeaderIncarnation) == h.Get(HeaderIncarnation)
}

// fromCopy reads a reminder from a fire or a failure record, which carry
// the schedule's headers.
func fromCopy(addr subjects.Address, name string, h nats.Header, payload []byte) (Reminder, error) {
	r := Reminder{Address: addr, Name: name, Type: h.Get(HeaderType), Payload: payload, incarnation: h.Get(HeaderIncarnation)}
	if p := h.Get(HeaderSchedule); p != "" {
		sch, err := parsePattern(p, h.Get(HeaderZone))
		if err != nil {
			return Reminder{}, err
		}
		r.Schedule = sch
	}
	return r, nil
}

// List returns the reminders of addr, or of every address when addr is
// empty, sorted by address then name: every (address, name) with a
// subject in the stream, read as Get reads it (a current schedule, a fire
// not yet delivered, or a recorded failure), cancelled ones left out. It
// blocks for a stream info and up to three direct gets per reminder,
// bounded by ctx. Errors match ErrInvalidReminder, ErrNoStore, or are JetStream's.
func (s *Store) List(ctx context.Context, addr subjects.Address) ([]Reminder, error) {
	if s == nil {
		return nil, ErrNoStore
	}
	filter := s.base + "*.*.*"
	if addr != "" {
		if err := addr.Validate(); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidReminder, err)
		}
		filter = s.base + "*." + subjects.EncodeToken(string(addr)) + ".*"
	}
	info, err := s.stream.Info(ctx, jetstream.WithSubjectFilter(filter))
	if err != nil {
		return nil, fmt.Errorf("reminders: list: %w", err)
	}
	type key struct {
		addr subjects.Address
		name string
	}
	seen := map[key]bool{}
	out := make([]Reminder, 0, len(info.State.Subjects))
	for subj := range info.State.Subjects {
		if strings.HasPrefix(subj, s.base+"i.") {
			continue // an incarnation alone is no reminder
		}
		a, n, err := s.parseSubject(subj)
		if err != nil {
			return nil, fmt.Errorf("reminders: list: %w", err)
		}
		if seen[key{a, n}] {
			continue
		}
		seen[key{a, n}] = true
		r, err := s.find(ctx, a, n)
		if errors.Is(err, ErrNotFound) {
			continue // cancelled, or delivered and gone since
		}
		if err != nil {
			return nil, fmt.Errorf("reminders: list: %w", err)
		}
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b Reminder) int {
		if c := strings.Compare(string(a.Address), string(b.Address)); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	return out, nil
}
