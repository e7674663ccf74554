package hub

import (
	"strconv"
	"strings"

	"github.com/natsmesh/natsmesh/verdict"
)

// Request and answer headers of the delivery protocol (docs/protocol.md). The
// verdict of a delivery travels in the headers of package verdict
// (Mesh-Verdict, Mesh-Reason, Mesh-Message, Mesh-Node).
const (
	// HeaderID is the delivery ID: required, unique per delivery, kept
	// across its retries (the intake dedupes on it). At most 128 bytes.
	HeaderID = "Mesh-Id"
	// HeaderFrom is the sending address (optional).
	HeaderFrom = "Mesh-From"
	// HeaderType is the delivery type (optional, at most 256 bytes).
	HeaderType = "Mesh-Type"
	// HeaderAttempt is the 1-based attempt number (optional, default 1).
	HeaderAttempt = "Mesh-Attempt"
	// HeaderSender is the sending node or client, "name.gen" (optional;
	// when absent, a mesh sender is known by its answer subject).
	HeaderSender = "Mesh-Sender"
	// HeaderAnswerTo is the subject that receives late answers and
	// responses for this delivery (optional: without it the hub cannot
	// send either).
	HeaderAnswerTo = "Mesh-Answer-To"
	// HeaderExpectResponse, set to "true", asks the handler's response to be
	// sent to HeaderAnswerTo (a request, not a plain delivery).
	HeaderExpectResponse = "Mesh-Expect-Response"
	// HeaderIdempotent, set to "true" on an ingress request, marks the
	// delivery Idempotent (mesh.Delivery.Idempotent): if its response is
	// lost after acceptance the ingress answers the resendable fact
	// instead of outcome-unknown. Hubs ignore it.
	HeaderIdempotent = "Mesh-Idempotent"
	// HeaderLane places a delivery in a windowed lane (DESIGN §4,
	// docs/protocol.md): "<epoch>/<seq>", epoch 1-[MaxEpochLen] bytes of
	// [0-9A-Za-z_-] naming one unbroken run of the sender's lane, seq its
	// 1-based position in that run. The intake accepts a lane's legs only in
	// sequence and refuses any other verdict.ErrOutOfOrder. Optional: a
	// delivery without it (one leg at a time, like `nats req`) is not
	// sequence-checked.
	HeaderLane = "Mesh-Lane"
	// HeaderWindow, on the Accepted reply to the first leg of a lane's
	// epoch (HeaderLane seq 1), is the receiver's grant: how many legs of
	// that lane it takes in flight at once, a decimal 1-[MaxWindow]. The
	// sender sizes the lane's window from it (never above its own cap);
	// absent, the sender keeps the window it has. The grant is what the
	// activation's inbox has room for when the epoch starts: half its free
	// room, at most Config.LaneWindow, at least 1.
	HeaderWindow = "Mesh-Window"
	// HeaderCaller is the caller identity the ingress node established
	// for a delivery it forwards from an outside client (DESIGN §10): from
	// the server-stamped Nats-Request-Info in the multi-account setup, or
	// from the reply subject's inbox prefix in a single account. It is set
	// only node to node (the client profile cannot publish deliveries),
	// and the intake keys dedupe and kept answers on (caller, ID): one
	// caller's ID never reaches another caller's delivery or answer. At
	// most [MaxCallerLen] bytes of printable ASCII without spaces; absent
	// for a node's own deliveries.
	HeaderCaller = "Mesh-Caller"
	// HeaderReminder names the reminder a delivery is a fire of
	// (DESIGN §13, package mesh/reminders): 1-128 bytes of printable
	// ASCII without spaces. Set only by a node's reminder runner (the
	// ingress forwards no such header), with HeaderReminderDue.
	HeaderReminder = "Mesh-Reminder"
	// HeaderReminderDue is the due time of a reminder's fire, RFC 3339
	// with nanoseconds, UTC.
	HeaderReminderDue = "Mesh-Reminder-Due"
	// HeaderAccept, set to [AcceptCompact] on a leg to a delivery
	// subject, asks for a compact Accepted reply (docs/protocol.md §4.1a):
	// no headers, the payload "+" followed by the accepting generation's
	// answer key — what a sender needs of an Accepted, without a header to
	// encode on the node and to parse on the sender. Every other reply (a
	// refusal, an Accepted carrying a HeaderWindow grant) keeps the header
	// form, and a node that does not know the header answers in the header
	// form, which a sender asking for compact replies must still read.
	HeaderAccept = "Mesh-Accept"
	// HeaderAnswer marks a message sent to an answer subject: "verdict" (a
	// late verdict that replaces the earlier Accepted) or "response" (the
	// handler's response). It carries HeaderID and the verdict headers.
	HeaderAnswer = "Mesh-Answer"
)

// AcceptCompact is the HeaderAccept value that asks for compact Accepted
// replies; CompactAccepted is the first byte of such a reply's payload.
const (
	AcceptCompact   = "compact"
	CompactAccepted = '+'
)

// ParseCompactAccepted reads a compact Accepted reply (HeaderAccept): a
// message with no headers whose payload is CompactAccepted followed by the
// answer key. It reports whether m is one, and the key. Pure.
func ParseCompactAccepted(hdrLen int, data []byte) (key string, ok bool) {
	if hdrLen != 0 || len(data) == 0 || data[0] != CompactAccepted {
		return "", false
	}
	return string(data[1:]), true
}

// Values of HeaderAnswer.
const (
	AnswerVerdict  = "verdict"
	AnswerResponse = "response"
)

// Limits on header values.
const (
	MaxIDLen   = 128
	MaxTypeLen = 256
	// MaxEpochLen bounds the epoch of a HeaderLane value.
	MaxEpochLen = 64
	// MaxWindow bounds a HeaderWindow grant.
	MaxWindow = 4096
	// MaxCallerLen bounds a HeaderCaller value.
	MaxCallerLen = 512
)

// ValidateCaller checks a HeaderCaller value: 1-[MaxCallerLen] bytes of
// printable ASCII without spaces. The error matches verdict.ErrBadRequest.
func ValidateCaller(c string) error {
	if c == "" || len(c) > MaxCallerLen {
		return verdict.New(verdict.ReasonBadRequest, "header %s must be 1-%d bytes (got %d)", HeaderCaller, MaxCallerLen, len(c))
	}
	for i := 0; i < len(c); i++ {
		if b := c[i]; b < 0x21 || b > 0x7e {
			return verdict.New(verdict.ReasonBadRequest, "header %s must be printable ASCII without spaces: byte %d is %#02x", HeaderCaller, i, b)
		}
	}
	return nil
}

// dedupeKey is the key the intake remembers a delivery under: its ID
// within its caller's scope. IDs hold no spaces, so the two never run
// together.
func dedupeKey(caller, id string) string {
	if caller == "" {
		return id
	}
	return caller + " " + id
}

// AnswerToken is the subject token under the prefix where mesh senders
// receive answers: <prefix>.ans.<name>.<gen>.
const AnswerToken = "ans"

// ValidateID checks a delivery ID: 1-[MaxIDLen] bytes of printable ASCII
// without spaces (0x21-0x7E). NATS trims whitespace in header values, so an
// ID with spaces or control characters could be merged with another. The
// error matches verdict.ErrInvalidID.
func ValidateID(id string) error {
	if id == "" || len(id) > MaxIDLen {
		return verdict.New(verdict.ReasonInvalidID, "delivery ID must be 1-%d bytes (got %d)", MaxIDLen, len(id))
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c < 0x21 || c > 0x7e {
			return verdict.New(verdict.ReasonInvalidID, "delivery ID must be printable ASCII without spaces: byte %d is %#02x", i, c)
		}
	}
	return nil
}

// ParseLane reads a HeaderLane value "<epoch>/<seq>". The error matches
// verdict.ErrBadRequest.
func ParseLane(v string) (epoch string, seq uint64, err error) {
	i := strings.LastIndexByte(v, '/')
	if i <= 0 || i > MaxEpochLen {
		return "", 0, verdict.New(verdict.ReasonBadRequest, "header %s: %q is not <epoch>/<seq> with a 1-%d byte epoch", HeaderLane, v, MaxEpochLen)
	}
	epoch = v[:i]
	for j := 0; j < len(epoch); j++ {
		if c := epoch[j]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_' || c == '-') {
			return "", 0, verdict.New(verdict.ReasonBadRequest, "header %s: epoch byte %d is %#02x, not [0-9A-Za-z_-]", HeaderLane, j, c)
		}
	}
	seq, perr := strconv.ParseUint(v[i+1:], 10, 63)
	if perr != nil || seq == 0 {
		return "", 0, verdict.New(verdict.ReasonBadRequest, "header %s: sequence %q is not a positive integer", HeaderLane, v[i+1:])
	}
	return epoch, seq, nil
}
