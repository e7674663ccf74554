package reminders

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Schedule says when a reminder fires: exactly one of At (once), Every (a
// fixed interval) or Cron (a cron expression, optionally in TimeZone).
// The NATS server runs it (JetStream message scheduling, ADR-51), so it
// keeps time while no node is up; see the package documentation for what
// happens to fires missed while the stream itself was down.
type Schedule struct {
	// At fires once at this instant (millisecond precision; a past
	// instant fires at once). The reminder is gone after it fired.
	At time.Time
	// Every fires repeatedly at this interval, a whole number of seconds
	// and at least 1 s (the server schedules @every in seconds), the first
	// fire one interval after Set (counted from the server's whole
	// second).
	Every time.Duration
	// Cron fires on a 6-field cron expression (seconds minutes hours
	// day-of-month month day-of-week) or one of @yearly, @monthly,
	// @weekly, @daily, @hourly, as nats-server parses it.
	Cron string
	// TimeZone is the IANA zone Cron is read in (e.g. "Europe/Paris");
	// empty means UTC. Only with Cron.
	TimeZone string
}

// At returns a one-shot schedule firing at t.
func At(t time.Time) Schedule { return Schedule{At: t} }

// In returns a one-shot schedule firing d from now (the caller's clock).
func In(d time.Duration) Schedule { return Schedule{At: time.Now().Add(d)} } // real clock: the server schedules it

// Every returns a schedule firing every d (whole seconds, at least 1 s).
func Every(d time.Duration) Schedule { return Schedule{Every: d} }

// Cron returns a schedule firing on expr, read in zone (empty: UTC).
func Cron(expr, zone string) Schedule { return Schedule{Cron: expr, TimeZone: zone} }

// OneShot reports whether s fires once (At).
func (s Schedule) OneShot() bool { return !s.At.IsZero() }

// String returns the schedule as the server's pattern: "@at <RFC 3339>",
// "@every <duration>" or the cron expression (with " in <zone>").
func (s Schedule) String() string {
	p, err := s.pattern()
	if err != nil {
		return "invalid schedule"
	}
	if s.TimeZone != "" {
		p += " in " + s.TimeZone
	}
	return p
}

// atLayout is the @at time's layout: RFC 3339 in UTC with milliseconds
// (nats-server parses it with time.RFC3339, which takes fractions).
const atLayout = "2006-01-02T15:04:05.000Z07:00"

// pattern returns the Nats-Schedule value of s, or why s is invalid
// (ErrInvalidReminder).
func (s Schedule) pattern() (string, error) {
	set := 0
	if !s.At.IsZero() {
		set++
	}
	if s.Every != 0 {
		set++
	}
	if s.Cron != "" {
		set++
	}
	switch {
	case set != 1:
		return "", fmt.Errorf("%w: a schedule needs exactly one of At, Every and Cron (got %d)", ErrInvalidReminder, set)
	case s.TimeZone != "" && s.Cron == "":
		return "", fmt.Errorf("%w: TimeZone is only for Cron", ErrInvalidReminder)
	case !s.At.IsZero():
		return "@at " + s.At.UTC().Format(atLayout), nil
	case s.Every != 0:
		if s.Every < time.Second {
			return "", fmt.Errorf("%w: interval %v is under the server's minimum of 1s", ErrInvalidReminder, s.Every)
		}
		if s.Every%time.Second != 0 {
			// The server keeps @every on whole seconds: a fraction would
			// fire on another interval than the one asked, with Due off.
			return "", fmt.Errorf("%w: interval %v is not a whole number of seconds (the server schedules @every in seconds)", ErrInvalidReminder, s.Every)
		}
		return "@every " + s.Every.String(), nil
	default:
		if err := ValidateCron(s.Cron); err != nil {
			return "", err
		}
		if s.TimeZone != "" {
			if _, err := time.LoadLocation(s.TimeZone); err != nil {
				return "", fmt.Errorf("%w: time zone %q: %v", ErrInvalidReminder, s.TimeZone, err)
			}
		}
		return s.Cron, nil
	}
}

// cronMacros are the named schedules nats-server (2.12-2.15,
// scheduler.go) accepts in place of six fields.
var cronMacros = []string{"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"}

// ValidateCron checks the shape of a cron expression as nats-server 2.15
// reads it (server/cron.go): exactly six fields, seconds first (seconds
// minutes hours day-of-month month day-of-week), or one of @yearly,
// @annually, @monthly, @weekly, @daily, @midnight, @hourly. The fields'
// values are left to the server. The error matches ErrInvalidReminder.
func ValidateCron(expr string) error {
	if strings.ContainsAny(expr, "\r\n") {
		return fmt.Errorf("%w: cron expression %q has a line break", ErrInvalidReminder, expr)
	}
	if strings.HasPrefix(expr, "@") {
		if slices.Contains(cronMacros, expr) {
			return nil
		}
		return fmt.Errorf("%w: cron expression %q: the named schedules are %s", ErrInvalidReminder, expr, strings.Join(cronMacros, ", "))
	}
	if n := len(strings.Fields(expr)); n != 6 {
		return fmt.Errorf("%w: cron expression %q has %d fields; nats-server needs six fields, seconds first (seconds minutes hours day-of-month month day-of-week), e.g. \"0 */5 * * * *\"", ErrInvalidReminder, expr, n)
	}
	return nil
}

// parsePattern reads a stored pattern back into a Schedule.
func parsePattern(p, zone string) (Schedule, error) {
	switch {
	case strings.HasPrefix(p, "@at "):
		t, err := time.Parse(time.RFC3339, p[4:])
		if err != nil {
			return Schedule{}, fmt.Errorf("reminders: stored schedule %q: %w", p, err)
		}
		return Schedule{At: t}, nil
	case strings.HasPrefix(p, "@every "):
		d, err := time.ParseDuration(p[7:])
		if err != nil {
			return Schedule{}, fmt.Errorf("reminders: stored schedule %q: %w", p, err)
		}
		return Schedule{Every: d}, nil
	case p == "":
		return Schedule{}, fmt.Errorf("reminders: stored schedule is empty")
	default:
		return Schedule{Cron: p, TimeZone: zone}, nil
	}
}
