package subjects

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Limits from DESIGN §1.
const (
	// MaxAddressLen is the longest address, in bytes.
	MaxAddressLen = 256
	// MaxStreamLen is the longest stream, in bytes.
	MaxStreamLen = 256
	// MaxNodeNameLen is the longest node name, in bytes.
	MaxNodeNameLen = 64
)

// Address names a hub: "kind/id". It is UTF-8 of 1–256 bytes with no control
// characters; kind is the part before the first "/" and picks the hub factory;
// id is the non-empty rest and may contain "/", ".", "~", spaces and any
// Unicode. An Address is a plain string: call [Address.Validate] (or
// [ParseAddress]) before trusting one that came from outside.
type Address string

// ParseAddress validates s and returns it as an [Address]. Errors match
// [ErrEmptyAddress], [ErrAddressTooLong], [ErrInvalidUTF8], [ErrControlChar],
// [ErrMissingKind] or [ErrMissingID].
func ParseAddress(s string) (Address, error) {
	a := Address(s)
	if err := a.Validate(); err != nil {
		return "", err
	}
	return a, nil
}

// Validate reports why a is not a valid address, or nil. See [ParseAddress]
// for the errors.
func (a Address) Validate() error {
	s := string(a)
	switch {
	case s == "":
		return ErrEmptyAddress
	case len(s) > MaxAddressLen:
		return fmt.Errorf("%w: %d bytes, limit %d", ErrAddressTooLong, len(s), MaxAddressLen)
	case !utf8.ValidString(s):
		return fmt.Errorf("%w in address %q", ErrInvalidUTF8, s)
	}
	for i, r := range s {
		if unicode.IsControl(r) {
			return fmt.Errorf("%w %U at byte %d of address %q", ErrControlChar, r, i, s)
		}
	}
	kind, id, ok := strings.Cut(s, "/")
	if !ok || kind == "" {
		return fmt.Errorf("%w: %q", ErrMissingKind, s)
	}
	if id == "" {
		return fmt.Errorf("%w: %q", ErrMissingID, s)
	}
	return nil
}

// Kind returns the part of a before its first "/", or "" if it has none.
func (a Address) Kind() string {
	kind, _, _ := strings.Cut(string(a), "/")
	return kind
}

// ID returns the part of a after its first "/", or "" if it has none.
func (a Address) ID() string {
	_, id, _ := strings.Cut(string(a), "/")
	return id
}

// String returns a as a string.
func (a Address) String() string { return string(a) }

// Stream is an ordering identity inside an address: 0–256 bytes of UTF-8. The
// empty stream is the destination-wide lane.
type Stream string

// Validate reports why s is not a valid stream ([ErrStreamTooLong],
// [ErrInvalidUTF8]), or nil.
func (s Stream) Validate() error {
	if len(s) > MaxStreamLen {
		return fmt.Errorf("%w: %d bytes, limit %d", ErrStreamTooLong, len(s), MaxStreamLen)
	}
	if !utf8.ValidString(string(s)) {
		return fmt.Errorf("%w in stream %q", ErrInvalidUTF8, string(s))
	}
	return nil
}

// NodeID identifies one incarnation of a mesh node. A restart of the same Name
// gets a strictly higher Generation; each generation has its own delivery
// subject. The zero NodeID is invalid. NodeID is comparable and is the key
// by which in-flight legs are indexed.
type NodeID struct {
	// Name is [A-Za-z0-9_-]{1,64}.
	Name string
	// Generation is > 0 and strictly increasing per Name.
	Generation uint64
}

// Validate reports why n is not a valid node identity ([ErrInvalidNodeName],
// [ErrInvalidGeneration]), or nil.
func (n NodeID) Validate() error {
	if err := ValidateNodeName(n.Name); err != nil {
		return err
	}
	if n.Generation == 0 {
		return fmt.Errorf("%w: 0", ErrInvalidGeneration)
	}
	return nil
}

// IsZero reports whether n is the zero NodeID.
func (n NodeID) IsZero() bool { return n == NodeID{} }

// String formats n as "name.generation", the form [ParseNodeID] reads.
func (n NodeID) String() string {
	return n.Name + "." + strconv.FormatUint(n.Generation, 10)
}

// MarshalText encodes n as "name.generation" (so JSON shows a string).
func (n NodeID) MarshalText() ([]byte, error) {
	if n.IsZero() {
		return []byte{}, nil
	}
	return []byte(n.String()), nil
}

// UnmarshalText reads the form MarshalText writes; empty text is the zero
// NodeID.
func (n *NodeID) UnmarshalText(b []byte) error {
	if len(b) == 0 {
		*n = NodeID{}
		return nil
	}
	id, err := ParseNodeID(string(b))
	if err != nil {
		return err
	}
	*n = id
	return nil
}

// ParseNodeID reads the "name.generation" form of [NodeID.String].
func ParseNodeID(s string) (NodeID, error) {
	name, gen, ok := strings.Cut(s, ".")
	if !ok {
		return NodeID{}, fmt.Errorf("%w: %q has no generation (want name.generation)", ErrInvalidGeneration, s)
	}
	if err := ValidateNodeName(name); err != nil {
		return NodeID{}, err
	}
	g, err := parseGeneration(gen)
	if err != nil {
		return NodeID{}, err
	}
	return NodeID{Name: name, Generation: g}, nil
}

// ValidateNodeName reports whether name matches [A-Za-z0-9_-]{1,64}
// (DESIGN §2); the error matches [ErrInvalidNodeName].
func ValidateNodeName(name string) error {
	if name == "" || len(name) > MaxNodeNameLen {
		return fmt.Errorf("%w: %q", ErrInvalidNodeName, name)
	}
	for i := 0; i < len(name); i++ {
		if !isNameByte(name[i]) {
			return fmt.Errorf("%w: %q", ErrInvalidNodeName, name)
		}
	}
	return nil
}

func isNameByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
}

// parseGeneration accepts only the canonical decimal form of a uint64 > 0, so
// that parsing a subject is injective.
func parseGeneration(s string) (uint64, error) {
	// Base-10 ParseUint accepts only digits, so the form is canonical
	// exactly when there is no leading zero.
	g, err := strconv.ParseUint(s, 10, 64)
	if err != nil || g == 0 || s[0] == '0' {
		return 0, fmt.Errorf("%w: %q", ErrInvalidGeneration, s)
	}
	return g, nil
}
