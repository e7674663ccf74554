package subjects

import "errors"

// Sentinel errors returned (wrapped with %w and details) by the validators and
// parsers of this package. Match them with [errors.Is].
var (
	// ErrEmptyAddress: the address is the empty string.
	ErrEmptyAddress = errors.New("subjects: empty address")
	// ErrAddressTooLong: the address is over [MaxAddressLen] bytes.
	ErrAddressTooLong = errors.New("subjects: address too long")
	// ErrMissingKind: the address has no "/" or nothing before its first "/".
	ErrMissingKind = errors.New("subjects: address has no kind (want kind/id)")
	// ErrMissingID: the address has nothing after its first "/".
	ErrMissingID = errors.New("subjects: address has no id (want kind/id)")
	// ErrStreamTooLong: the stream is over [MaxStreamLen] bytes.
	ErrStreamTooLong = errors.New("subjects: stream too long")
	// ErrInvalidUTF8: an address or stream is not valid UTF-8.
	ErrInvalidUTF8 = errors.New("subjects: invalid UTF-8")
	// ErrControlChar: an address contains a control character.
	ErrControlChar = errors.New("subjects: control character")
	// ErrInvalidNodeName: a node name is not [A-Za-z0-9_-]{1,64}.
	ErrInvalidNodeName = errors.New("subjects: invalid node name (want [A-Za-z0-9_-]{1,64})")
	// ErrInvalidGeneration: a generation is zero or not canonical decimal.
	ErrInvalidGeneration = errors.New("subjects: invalid generation (want decimal > 0)")
	// ErrInvalidPrefix: a subject prefix is not dot-separated [A-Za-z0-9_-] tokens.
	ErrInvalidPrefix = errors.New("subjects: invalid prefix")
	// ErrInvalidToken: a subject token is not a valid encoding of an address or stream.
	ErrInvalidToken = errors.New("subjects: invalid token")
	// ErrInvalidSubject: a subject does not have the shape the parser expects.
	ErrInvalidSubject = errors.New("subjects: invalid subject")
)
