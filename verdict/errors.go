package verdict

import "fmt"

// Reason says which fact a mesh failure reports. Each reason fixes its
// [ErrorType] and its place on the ladder (see the package documentation).
// Reasons travel on the wire as their String form in the [HeaderReason]
// header.
type Reason uint8

// Reasons. The zero value is ReasonUnknown.
const (
	ReasonUnknown Reason = iota
	// Sender-side facts: nothing reached a callee.
	ReasonNoPlacement   // no live node hosts the address's kind
	ReasonDeparted      // the owner generation departed or was superseded
	ReasonDirectoryDown // the directory/KV is temporarily unreachable
	ReasonClosing       // this mesh client is closing or draining
	// Hub refusals, answered by the intake before acceptance.
	ReasonHubShuttingDown  // the node or activation is draining
	ReasonNotOwner         // another live generation owns the address
	ReasonActivationFailed // the hub's factory or build failed
	ReasonStormBreaker     // the (sender, target, type, stream) rate limit tripped
	ReasonInboxFull        // the activation's bounded inbox is full
	ReasonBadRequest       // the delivery is malformed
	ReasonHandlerError     // the handler reported an error
	ReasonUnknownKind      // this node hosts no hub of the address's kind
	ReasonInvalidAddress   // the address, stream or type is invalid
	ReasonPayloadTooLarge  // the payload is over the server's max_payload
	// Added in round 2; appended so older numbering stays stable (the wire
	// carries names, not numbers).
	ReasonOutcomeUnknown // accepted, then the answer was lost: the handler may have run
	ReasonDeadlineUnsent // the caller's deadline passed before any leg was sent
	ReasonInvalidID      // the delivery ID is not 1-128 bytes of printable ASCII without spaces
	ReasonResponseGone   // a duplicate of a handled request whose response is no longer kept
	ReasonOutOfOrder     // a windowed lane's leg arrived out of its sequence (DESIGN §4)
	// Added in round 3 (issue 24: every Failed reply names its reason).
	ReasonTimeout   // a leg or an awaited response timed out inside the mesh: the callee may hold it
	ReasonCanceled  // the sender's own context was cancelled
	ReasonInternal  // a failure the protocol has no other name for; Mesh-Message says what
	ReasonCallCycle // a request would wait on an address already waiting in its own call chain (DESIGN §13)
	numReasons
)

var reasonNames = [numReasons]string{
	ReasonUnknown:          "unknown",
	ReasonNoPlacement:      "no-placement",
	ReasonDeparted:         "departed",
	ReasonDirectoryDown:    "directory-unavailable",
	ReasonClosing:          "closing",
	ReasonHubShuttingDown:  "shutting-down",
	ReasonNotOwner:         "not-owner",
	ReasonActivationFailed: "activation-failed",
	ReasonStormBreaker:     "storm-breaker",
	ReasonInboxFull:        "inbox-full",
	ReasonBadRequest:       "bad-request",
	ReasonHandlerError:     "handler-error",
	ReasonUnknownKind:      "unknown-kind",
	ReasonInvalidAddress:   "invalid-address",
	ReasonPayloadTooLarge:  "payload-too-large",
	ReasonOutcomeUnknown:   "outcome-unknown",
	ReasonDeadlineUnsent:   "deadline-unsent",
	ReasonInvalidID:        "invalid-id",
	ReasonResponseGone:     "response-gone",
	ReasonOutOfOrder:       "out-of-order",
	ReasonTimeout:          "timeout",
	ReasonCanceled:         "canceled",
	ReasonInternal:         "internal",
	ReasonCallCycle:        "call-cycle",
}

// String returns the reason's wire name, e.g. "not-owner".
func (r Reason) String() string {
	if r < numReasons {
		return reasonNames[r]
	}
	return fmt.Sprintf("reason(%d)", uint8(r))
}

// parseReason maps a wire name back to its Reason, or ReasonUnknown.
func parseReason(s string) Reason {
	for r, n := range reasonNames {
		if n == s {
			return Reason(r)
		}
	}
	return ReasonUnknown
}

// rung is a reason's fixed place on the ladder (DESIGN §3). A rung that is
// transient but not resendable says the callee may hold the delivery, as a
// timeout does.
type rung struct {
	typ        ErrorType
	transient  bool
	resendable bool
}

var ladder = [numReasons]rung{
	ReasonUnknown:          {Failed, false, false},
	ReasonNoPlacement:      {Unavailable, true, true},
	ReasonDeparted:         {ShuttingDown, true, true},
	ReasonDirectoryDown:    {ShuttingDown, true, true},
	ReasonClosing:          {ShuttingDown, true, true},
	ReasonHubShuttingDown:  {ShuttingDown, true, true},
	ReasonNotOwner:         {ShuttingDown, true, true},
	ReasonActivationFailed: {Unavailable, false, false},
	ReasonStormBreaker:     {Ignored, false, false},
	ReasonInboxFull:        {Ignored, false, false},
	ReasonBadRequest:       {Failed, false, false},
	ReasonHandlerError:     {Failed, false, false},
	ReasonUnknownKind:      {Failed, false, false},
	ReasonInvalidAddress:   {Failed, false, false},
	ReasonPayloadTooLarge:  {Failed, false, false},
	ReasonOutcomeUnknown:   {Failed, true, false},
	ReasonDeadlineUnsent:   {Unavailable, true, true},
	ReasonInvalidID:        {Failed, false, false},
	ReasonResponseGone:     {Failed, false, false},
	ReasonOutOfOrder:       {ShuttingDown, true, true},
	ReasonTimeout:          {Failed, true, false},
	ReasonCanceled:         {Failed, false, false},
	ReasonInternal:         {Failed, false, false},
	ReasonCallCycle:        {Failed, false, false},
}

// Sentinels, one per [Reason]. Every *[Error] of the same reason matches its
// sentinel with [errors.Is], including errors decoded from reply headers, so
// callers test errors.Is(err, verdict.ErrNotOwner) whatever the detail text.
var (
	// ErrNoPlacement: no live node hosts the address's kind; nothing was sent.
	// Unavailable, resendable (a node may join).
	ErrNoPlacement = sentinel(ReasonNoPlacement, "no live node hosts this kind")
	// ErrDeparted: the owner generation departed or was superseded; it can
	// never answer again. ShuttingDown, resendable after a re-resolve.
	ErrDeparted = sentinel(ReasonDeparted, "owner node departed")
	// ErrDirectoryUnavailable: the directory could not be read; nothing was
	// sent. ShuttingDown, resendable.
	ErrDirectoryUnavailable = sentinel(ReasonDirectoryDown, "directory unavailable")
	// ErrClosing: this mesh client is closing or draining. ShuttingDown; the
	// delivery may be sent again, but not by this closing process.
	ErrClosing = sentinel(ReasonClosing, "mesh client closing")
	// ErrHubShuttingDown: the hub refused because it is draining.
	// ShuttingDown, resendable.
	ErrHubShuttingDown = sentinel(ReasonHubShuttingDown, "hub shutting down")
	// ErrNotOwner: the node refused because another live generation owns the
	// address. ShuttingDown, resendable after a re-resolve.
	ErrNotOwner = sentinel(ReasonNotOwner, "not the owner")
	// ErrActivationFailed: the hub's factory or build failed. Unavailable,
	// not transient.
	ErrActivationFailed = sentinel(ReasonActivationFailed, "activation failed")
	// ErrStormBreaker: the storm breaker refused. Ignored; re-sending feeds
	// the overload it reports.
	ErrStormBreaker = sentinel(ReasonStormBreaker, "storm breaker open")
	// ErrInboxFull: the activation's inbox is full. Ignored.
	ErrInboxFull = sentinel(ReasonInboxFull, "inbox full")
	// ErrBadRequest: the delivery was malformed. Failed.
	ErrBadRequest = sentinel(ReasonBadRequest, "bad request")
	// ErrHandler: the hub's handler returned an error. Failed.
	ErrHandler = sentinel(ReasonHandlerError, "handler error")
	// ErrUnknownKind: the node hosts no hub of this kind. Failed.
	ErrUnknownKind = sentinel(ReasonUnknownKind, "unknown hub kind")
	// ErrInvalidAddress: the address, stream or type is invalid; nothing was
	// sent. Failed.
	ErrInvalidAddress = sentinel(ReasonInvalidAddress, "invalid address")
	// ErrPayloadTooLarge: the payload is over the server's max_payload;
	// nothing was sent. Failed.
	ErrPayloadTooLarge = sentinel(ReasonPayloadTooLarge, "payload too large")
	// ErrOutcomeUnknown: a hub accepted the delivery, then the answer that
	// was awaited (a Request's response, a late verdict) was lost — its
	// owner departed, or this sender's own link dropped, or this client
	// closed — so the handler may or may not have run. Failed, transient but
	// not resendable (like a timeout): the caller reconciles. A delivery
	// marked Idempotent gets the underlying resendable verdict instead.
	ErrOutcomeUnknown = sentinel(ReasonOutcomeUnknown, "outcome unknown")
	// ErrDeadlineUnsent: the caller's deadline passed while the delivery
	// waited for its lane, an in-flight slot or a back-off, with no leg in
	// flight and nothing accepted. Unavailable, resendable: never a timeout,
	// because no callee holds it.
	ErrDeadlineUnsent = sentinel(ReasonDeadlineUnsent, "deadline passed before the delivery was sent")
	// ErrInvalidID: the delivery ID is not 1-128 bytes of printable ASCII
	// without spaces (NATS trims whitespace in header values, which would
	// merge IDs). Failed, returned before anything is sent; hubs and the
	// ingress refuse such a delivery with it.
	ErrInvalidID = sentinel(ReasonInvalidID, "invalid delivery ID")
	// ErrResponseGone: a duplicate of a Request that was already handled,
	// whose response the hub no longer keeps (the bounded response store
	// evicted it). Failed: the handler ran once; its response is lost.
	ErrResponseGone = sentinel(ReasonResponseGone, "response no longer kept")
	// ErrOutOfOrder: the intake refused a leg of a windowed lane that is
	// not the next in its lane's sequence (an earlier leg was not
	// accepted, or the intake holds no state for the lane: evicted, or a
	// new activation). Nothing was accepted. ShuttingDown, resendable: the
	// sender re-sends from its first unaccepted delivery, in order, in a
	// new lane epoch (DESIGN §4, docs/protocol.md).
	ErrOutOfOrder = sentinel(ReasonOutOfOrder, "out of order in its lane")
	// ErrTimeout: a leg, or the response a request awaited, timed out
	// inside the mesh (a node's sender reports it so on the wire, e.g. to
	// an ingress caller). Failed, transient but not resendable: the callee
	// may hold the delivery (DESIGN §3).
	ErrTimeout = sentinel(ReasonTimeout, "timed out")
	// ErrCanceled: the sending node's own context was cancelled. Failed.
	ErrCanceled = sentinel(ReasonCanceled, "canceled")
	// ErrInternal: a failure the protocol has no other reason for (the
	// message says what). Failed.
	ErrInternal = sentinel(ReasonInternal, "internal failure")
	// ErrCallCycle: a Request sent from a hub's turn names an address that
	// is already waiting in the same call chain (A → B → A), whose kind
	// does not allow reentrancy: waiting would deadlock until the
	// deadline, so the intake refuses it at once (DESIGN §13). Failed, not
	// transient: the same request would meet the same cycle.
	ErrCallCycle = sentinel(ReasonCallCycle, "call cycle")
)

func sentinel(r Reason, msg string) *Error {
	return &Error{Reason: r, Message: msg}
}
