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
	// ErrNoStore: a method was called on a nil *Store — what
	// mesh.Node.Reminders returns before Start, without membership, or
	// with reminders disabled.
	ErrNoStore = errors.New("reminders: no store (nil: the node has no membership, reminders are disabled, or it is not started)")
	// ErrConcurrent: a Set or Cancel of the same reminder that ran
	// concurrently took effect after this one began; this one did not
	// (the other's outcome stands).
	ErrConcurrent = errors.New("reminders: a concurrent Set or Cancel of this reminder took effect instead")
	// ErrStopped: the runner was stopped.
	ErrStopped = errors.New("reminders: runner stopped")
)
