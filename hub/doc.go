// Package hub is the receiving side of the mesh (DESIGN §5): a [Host] holds a
// node generation's one NATS subscription, <prefix>.dlv.<node>.<gen>.>, and
// routes each delivery in memory to the activation of its address.
//
// The intake answers on acceptance: as soon as a delivery is in its
// activation's bounded inbox the request is answered Accepted with the node's
// identity — never after the handler and never after the hub's build. A hub
// may take far longer to build than any request timeout; deliveries accepted
// meanwhile are parked and handled in acceptance order once it is ready.
//
// Each delivery gets exactly one verdict. If something fails after
// acceptance (the build failed: Unavailable; the activation was deactivated
// before handling it: ShuttingDown), the failure is sent once to the sender's
// answer subject as a late verdict. Whether the handler or a failure settles
// an accepted delivery is decided by compare-and-swap, as is whether a failure
// travels in the synchronous reply (it happened before the reply was sent) or
// as a late answer.
//
// A hub handles one delivery at a time in acceptance order (turns). An idle
// activation costs a few hundred bytes and no goroutine: a turn goroutine runs
// only while the inbox holds work.
//
// Durable state (DESIGN §7a): a factory that calls [LoadState] takes the
// address's stored state over before its activation serves; [State.Save] is
// a compare-and-set on the revision the activation last wrote, so an
// activation that lost its address fails its save with [ErrStateFenced] and
// stands down. The host declares [StateStore]; the node wires it to a
// JetStream KV bucket (package mesh/hubstate). A [Batcher] hub handles the
// deliveries queued together in one turn, for instance to save their
// changes once.
//
// Files, by room: host.go (configuration, the Host and its counters),
// intake.go (parse, dedupe, dispatch, the synchronous reply), park.go
// (deliveries parked on a cold address's claim), claims.go (the claims
// seam: tokens, not names), lifecycle.go (activation, stand-down,
// collection, drain, close), activation.go (the inbox and turns),
// settle.go (responses, late verdicts), dedupe.go, lanes.go, breaker.go,
// state.go, answer.go, wire.go (headers and limits), trace.go.
package hub
