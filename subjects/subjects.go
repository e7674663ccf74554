// Package subjects turns mesh identities — addresses, streams and node
// generations — into NATS subjects and back (DESIGN §1–§2).
//
// Subjects, with <prefix> defaulting to [DefaultPrefix] "mesh.v1":
//
//	<prefix>.dlv.<node>.<gen>.<addr>.<stream>   one delivery (request/reply)
//	<prefix>.dlv.<node>.<gen>.>                 a node generation's one subscription
//	<prefix>.in.<addr>.<stream>                 ingress for clients outside the mesh
//
// <addr> and <stream> are single tokens written by [EncodeToken]; <node> is a
// node name ([A-Za-z0-9_-]{1,64}) and <gen> the canonical decimal generation.
// The encoding is injective and wildcard-safe, so no address or stream can
// widen a subscription or collide with another destination, and the parsers
// return exactly the parts the builders were given. All functions are pure and
// safe for concurrent use.
package subjects

import (
	"fmt"
	"strconv"
	"strings"
)

// Prefix is the dot-separated subject prefix every mesh subject starts with:
// one or more tokens of [A-Za-z0-9_-]. Several meshes can share a NATS account
// by using different prefixes. The zero Prefix is not valid; use
// [DefaultPrefix] or [ParsePrefix].
type Prefix string

// DefaultPrefix is the prefix used when none is configured.
const DefaultPrefix Prefix = "mesh.v1"

// Kinds of subject under a prefix.
const (
	deliveryToken = "dlv"
	ingressToken  = "in"
)

// ParsePrefix validates s as a [Prefix]; the error matches [ErrInvalidPrefix].
func ParsePrefix(s string) (Prefix, error) {
	p := Prefix(s)
	if err := p.Validate(); err != nil {
		return "", err
	}
	return p, nil
}

// Validate reports why p is not a valid prefix ([ErrInvalidPrefix]), or nil.
func (p Prefix) Validate() error {
	if p == "" || len(p) > 128 {
		return fmt.Errorf("%w: %q (want 1-128 bytes)", ErrInvalidPrefix, string(p))
	}
	for tok := range strings.SplitSeq(string(p), ".") {
		if tok == "" {
			return fmt.Errorf("%w: %q has an empty token", ErrInvalidPrefix, string(p))
		}
		for i := 0; i < len(tok); i++ {
			if !isNameByte(tok[i]) {
				return fmt.Errorf("%w: %q (tokens must be [A-Za-z0-9_-])", ErrInvalidPrefix, string(p))
			}
		}
	}
	return nil
}

// Sub returns "<prefix>.<rest>" for subjects outside the delivery and ingress
// families (node control, late answers, announcements). rest is not checked.
func (p Prefix) Sub(rest string) string { return string(p) + "." + rest }

// NodeInbox returns the inbox prefix mesh nodes of p connect with
// (nats.CustomInboxPrefix): "_INBOX_" followed by p with dots as
// underscores, e.g. "_INBOX_mesh_v1". The node permission profile alone may
// subscribe under it (SECURITY.md), so the acceptance replies nodes receive
// stay among nodes.
func (p Prefix) NodeInbox() string {
	return "_INBOX_" + strings.ReplaceAll(string(p), ".", "_")
}

// SafeReply reports whether a mesh node may publish an answer to reply, a
// reply subject its requester chose freely (NATS checks no permission on
// reply subjects, and the node publishes with its own): a literal subject
// (non-empty tokens, no wildcards, spaces or control characters), not
// under "$" (the JetStream API, KV buckets, system and service subjects) and
// not under p (control, deliveries, answers). Inboxes are safe.
func (p Prefix) SafeReply(reply string) bool {
	if reply == "" || reply[0] == '$' || strings.HasPrefix(reply, string(p)+".") {
		return false
	}
	for tok := range strings.SplitSeq(reply, ".") {
		if tok == "" || tok == "*" || tok == ">" {
			return false
		}
		for i := 0; i < len(tok); i++ {
			if c := tok[i]; c <= ' ' || c == 0x7f {
				return false
			}
		}
	}
	return true
}

// Control returns <prefix>.ctl.<node-name>.<verb>, a node's control
// endpoint (the verbs are defined by package mesh).
func (p Prefix) Control(nodeName, verb string) string {
	return string(p) + ".ctl." + nodeName + "." + verb
}

// Delivery returns <prefix>.dlv.<node>.<gen>.<addr>.<stream>. The inputs are
// not validated here (the encoding is safe for any bytes); validate an
// address, a stream and a node before sending to them.
func (p Prefix) Delivery(node NodeID, addr Address, stream Stream) string {
	var g [20]byte
	gen := strconv.AppendUint(g[:0], node.Generation, 10) // no string of its own: one allocation in all
	var b strings.Builder
	b.Grow(len(p) + len(deliveryToken) + len(node.Name) + len(gen) + encodedLen(string(addr)) + encodedLen(string(stream)) + 5)
	b.WriteString(string(p))
	b.WriteString("." + deliveryToken + ".")
	b.WriteString(node.Name)
	b.WriteByte('.')
	b.Write(gen)
	b.WriteByte('.')
	appendToken(&b, string(addr))
	b.WriteByte('.')
	appendToken(&b, string(stream))
	return b.String()
}

// NodeSubscription returns <prefix>.dlv.<node>.<gen>.>, the one subscription
// a node generation holds for all its activations.
func (p Prefix) NodeSubscription(node NodeID) string {
	return string(p) + "." + deliveryToken + "." + node.Name + "." + strconv.FormatUint(node.Generation, 10) + ".>"
}

// Ingress returns <prefix>.in.<addr>.<stream>.
func (p Prefix) Ingress(addr Address, stream Stream) string {
	var b strings.Builder
	b.Grow(len(p) + len(ingressToken) + encodedLen(string(addr)) + encodedLen(string(stream)) + 3)
	b.WriteString(string(p))
	b.WriteString("." + ingressToken + ".")
	appendToken(&b, string(addr))
	b.WriteByte('.')
	appendToken(&b, string(stream))
	return b.String()
}

// IngressSubscription returns <prefix>.in.*.*, the subject the nodes serve as
// a queue group.
func (p Prefix) IngressSubscription() string {
	return string(p) + "." + ingressToken + ".*.*"
}

// Delivery is a parsed delivery subject.
type Delivery struct {
	Node   NodeID
	Addr   Address
	Stream Stream
}

// ParseDelivery parses a subject built by [Prefix.Delivery]. It returns
// exactly the node, address and stream it was built from, or an error matching
// [ErrInvalidSubject], [ErrInvalidToken] or one of the validation sentinels
// when the subject is not the canonical delivery subject of a valid
// destination under p.
func (p Prefix) ParseDelivery(subject string) (Delivery, error) {
	rest, ok := p.trim(subject, deliveryToken)
	if !ok {
		return Delivery{}, fmt.Errorf("%w: %q is not a delivery subject under %q", ErrInvalidSubject, subject, string(p))
	}
	var toks [4]string
	for i := range 3 {
		var ok bool
		if toks[i], rest, ok = strings.Cut(rest, "."); !ok {
			return Delivery{}, fmt.Errorf("%w: %q: want <prefix>.dlv.<node>.<gen>.<addr>.<stream>", ErrInvalidSubject, subject)
		}
	}
	if strings.IndexByte(rest, '.') >= 0 {
		return Delivery{}, fmt.Errorf("%w: %q: want <prefix>.dlv.<node>.<gen>.<addr>.<stream>", ErrInvalidSubject, subject)
	}
	toks[3] = rest
	if err := ValidateNodeName(toks[0]); err != nil {
		return Delivery{}, err
	}
	gen, err := parseGeneration(toks[1])
	if err != nil {
		return Delivery{}, err
	}
	addr, stream, err := decodeDestination(toks[2], toks[3])
	if err != nil {
		return Delivery{}, err
	}
	return Delivery{Node: NodeID{Name: toks[0], Generation: gen}, Addr: addr, Stream: stream}, nil
}

// ParseIngress parses a subject built by [Prefix.Ingress], with the same
// guarantees and errors as [Prefix.ParseDelivery].
func (p Prefix) ParseIngress(subject string) (Address, Stream, error) {
	rest, ok := p.trim(subject, ingressToken)
	if !ok {
		return "", "", fmt.Errorf("%w: %q is not an ingress subject under %q", ErrInvalidSubject, subject, string(p))
	}
	a, s, ok := strings.Cut(rest, ".")
	if !ok || strings.IndexByte(s, '.') >= 0 {
		return "", "", fmt.Errorf("%w: %q: want <prefix>.in.<addr>.<stream>", ErrInvalidSubject, subject)
	}
	return decodeDestination(a, s)
}

// trim strips "<prefix>.<kind>." from subject.
func (p Prefix) trim(subject, kind string) (string, bool) {
	rest, ok := strings.CutPrefix(subject, string(p))
	if !ok {
		return "", false
	}
	rest, ok = strings.CutPrefix(rest, "."+kind+".")
	return rest, ok
}

func decodeDestination(at, st string) (Address, Stream, error) {
	a, err := DecodeToken(at)
	if err != nil {
		return "", "", err
	}
	addr, err := ParseAddress(a)
	if err != nil {
		return "", "", err
	}
	s, err := DecodeToken(st)
	if err != nil {
		return "", "", err
	}
	stream := Stream(s)
	if err := stream.Validate(); err != nil {
		return "", "", err
	}
	return addr, stream, nil
}
