package reminders

import "errors"

var (
	// ErrInvalidConfig: a required Config or RunConfig field is missing or
	// invalid.
	ErrInvalidConfig = errors.New("reminders: invalid config")
	// ErrInvalidReminder: a reminder's address, name, type or schedule is
	// invalid; nothing was written.
	ErrInvalidReminder = errors.New("reminders: invalid reminder")
	// ErrNotFound: the address has no current reminder of that name (never
	// set, cancelled, or a one-shot that already fired).
	ErrNotFound = errors.New("reminders: no such reminder")
	// ErrStopped: the runner was stopped.
	ErrStopped = errors.New("reminders: runner stopped")
)
