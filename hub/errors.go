package hub

import "errors"

var (
	// ErrInvalidConfig: a required Config field is missing or invalid.
	ErrInvalidConfig = errors.New("hub: invalid config")
	// ErrHostClosed: the host was closed or drained.
	ErrHostClosed = errors.New("hub: host closed")
	// ErrKindRegistered: a factory is already registered for the kind.
	ErrKindRegistered = errors.New("hub: kind already registered")
	// ErrAlreadyResponded: Respond was called twice for one delivery.
	ErrAlreadyResponded = errors.New("hub: delivery already responded")
)
