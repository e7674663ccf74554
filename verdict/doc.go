// Package verdict says what a failed delivery means and whether it is safe to
// send it again (DESIGN §3).
//
// Every delivery ends with exactly one verdict: Accepted, or a failure whose
// [ErrorType] is Failed, ShuttingDown, Unavailable or Ignored. Three
// predicates read a failure, each strictly narrower than the last:
//
//	IsTransient(err)       is another attempt conceivable at all?
//	  ⊇ IsResendable(err)  may this SAME request be sent again now?
//	      ⊇ Classify(err) == ShuttingDown
//	                       should the sender keep its recovery (resubscribe) armed?
//
// Do not collapse them. The middle rung exists because a refusal and a
// timeout are both transient yet are opposite facts about who holds the
// request. A refusal (NATS no responders on a departed generation's subject,
// "not the owner", a hub shutting down) means the callee holds nothing, so the
// same delivery may go again once its owner is re-resolved. A timeout means
// only that the caller stopped waiting: the callee may have accepted the
// delivery and may still run it. Re-sending would duplicate work on the one
// destination that is already too slow, and a retry budget sized for instant
// refusals (250 ms → 3 s) would hold each slot for seven whole timeouts — a
// positive feedback loop wearing a recovery's clothes (see the seeds behind
// DESIGN.md). So a timeout is transient but never resendable, and it
// classifies Failed rather than ShuttingDown: telling a subscriber "keep
// recovering" about a plausibly wedged target would arm an unbounded
// resubscribe against it.
//
// An unknown outcome ([ErrOutcomeUnknown]) sits on the timeout's rung for the
// same reason: a hub accepted the delivery, then the answer that was awaited
// was lost (its owner departed, the sender's own link dropped, the sender
// closed), so the handler may have run. It is reported at once, not at the
// deadline. A delivery marked Idempotent gets the underlying resendable
// verdict instead. The reverse case — the caller's deadline passed while
// nothing was in flight and nothing accepted ([ErrDeadlineUnsent]) — is
// Unavailable and resendable, never a timeout.
//
// The predicates walk the whole error graph ([errors.Is] and [errors.As] over
// %w-wrapped and [errors.Join]ed errors), and their answers do not depend on
// where in the graph a fact sits: a timeout anywhere makes the error
// non-resendable, a caller's cancellation or a terminal refusal anywhere makes
// it non-transient.
//
// They recognise the nats.go errors named in DESIGN §3 directly
// ([nats.ErrNoResponders], [nats.ErrTimeout], [nats.ErrDisconnected],
// [nats.ErrReconnectBufExceeded], [nats.ErrConnectionClosed],
// [nats.ErrConnectionDraining], [nats.ErrMaxPayload]) and the context errors:
// [context.DeadlineExceeded] (a leg's deadline: a timeout) and
// [context.Canceled] (the caller chose: Failed, not transient). Mesh facts are
// [*Error] values with a [Reason]; each reason has a sentinel in errors.go.
//
// On the wire a verdict travels as reply headers ([HeaderVerdict],
// [HeaderReason], [HeaderMessage], [HeaderNode]); [Decode] turns them back into
// an *Error that matches the same sentinels.
package verdict
