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
	// ErrNoStateStore: the host keeps no durable state (no StateStore
	// configured), or LoadState was called outside a factory.
	ErrNoStateStore = errors.New("hub: no state store")
	// ErrStateTooLarge: the state is over the store's max value size;
	// nothing was written.
	ErrStateTooLarge = errors.New("hub: state too large")
	// ErrStateFenced: another activation took the address's state over (or
	// this one stood down); nothing was written and the activation stands
	// down.
	ErrStateFenced = errors.New("hub: state fenced by a newer activation")
	// ErrStateUnavailable: the state store could not be reached; nothing
	// was written.
	ErrStateUnavailable = errors.New("hub: state store unavailable")
	// ErrStateUnknown: the state store could not say whether a save was
	// written; the activation stands down.
	ErrStateUnknown = errors.New("hub: state save outcome unknown")
)
