package reminders

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsmesh/natsmesh/subjects"
)

// Fire is one fire of a reminder, as a Runner hands it to its Deliverer.
type Fire struct {
	// ID is the delivery ID of this fire: "rem-" and 32 hex digits of a
	// SHA-256 over (address, name, incarnation, due). Every delivery
	// attempt of one fire carries it, on any node, so the receiving
	// intake dedupes a re-fire (DESIGN §5).
	ID       string
	Address  subjects.Address
	Name     string
	Type     string
	Payload  []byte
	Schedule Schedule
	// Due is when the fire was due: the At time of a one-shot, the
	// interval instant of Every; for Cron the time the server produced
	// the fire (it stamps no cron instant: within its timer's 250 ms
	// unless the server was busy).
	Due time.Time
	// Attempt is the 1-based count of JetStream deliveries of this fire
	// to a runner (any node's).
	Attempt int
}

// fire reads a fire message; it returns the fire and its schedule subject.
func (r *Runner) fire(m jetstream.Msg) (Fire, string, error) {
	var f Fire
	h := m.Headers()
	sched := h.Get(natsScheduler)
	addr, name, err := r.s.parseSubject(m.Subject())
	if err != nil {
		return f, sched, err
	}
	f.Address, f.Name, f.Type, f.Payload = addr, name, h.Get(HeaderType), m.Data()
	if sched != r.s.subject("s", addr, name) {
		return f, sched, fmt.Errorf("fire names schedule %q", sched)
	}
	f.Schedule, err = parsePattern(h.Get(HeaderSchedule), h.Get(HeaderZone))
	if err != nil {
		return f, sched, err
	}
	md, err := m.Metadata()
	if err != nil {
		return f, sched, err
	}
	f.Attempt = int(md.NumDelivered)
	next := h.Get(natsScheduleNext)
	key := next
	if f.Schedule.OneShot() {
		key = f.Schedule.At.UTC().Format(atLayout)
	}
	if f.Due, err = fireDue(f.Schedule, next, md.Timestamp); err != nil {
		return f, sched, err
	}
	f.ID = FireID(addr, name, h.Get(HeaderIncarnation), key)
	return f, sched, nil
}

// fireDue is the due time of a fire of sch with the server's
// Nats-Schedule-Next next, stored at ts.
func fireDue(sch Schedule, next string, ts time.Time) (time.Time, error) {
	switch {
	case sch.OneShot():
		return sch.At, nil
	case sch.Every != 0:
		t, err := time.Parse(time.RFC3339Nano, next)
		if err != nil {
			return ts, fmt.Errorf("header %s: %w", natsScheduleNext, err)
		}
		return t.Add(-sch.Every), nil
	default:
		if next == "" {
			return ts, fmt.Errorf("header %s missing", natsScheduleNext)
		}
		return ts, nil
	}
}

// FireID is the delivery ID of the fire of (address, name, incarnation)
// whose identity within its schedule is key (the @at time of a one-shot,
// the server's Nats-Schedule-Next of a repeating fire: a fire's due time
// and its next one determine each other).
func FireID(addr subjects.Address, name, incarnation, key string) string {
	h := sha256.New()
	for _, s := range []string{string(addr), name, incarnation, key} {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	return "rem-" + hex.EncodeToString(h.Sum(nil)[:16])
}
