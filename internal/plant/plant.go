// Package plant plants known bugs in the mesh, for the nemesis to find
// (issue 21, "proof the checker bites"): each bug is a one-line deviation
// at the place the mesh guards a guarantee, switched on only in a binary
// built with the build tag natsmesh_plant AND named in the environment
// variable NATSMESH_PLANT (comma-separated). Without the tag every On is a
// constant false, so no production build can be switched. The tests that
// use it are integration.TestNemesisPlanted*.
package plant

import "time"

// Bug names a planted bug.
type Bug string

// The bugs, each with the check that must catch it.
const (
	// SkipDedupe: the intake forgets every delivery ID it accepted, so a
	// re-send is handled again (at-most-once).
	SkipDedupe Bug = "skip-dedupe"
	// ReorderLane: an activation takes its inbox newest first when two
	// or more deliveries wait (lane-order).
	ReorderLane Bug = "reorder-lane"
	// AckUnsaved: the hub state store acknowledges a save without writing
	// it — the activation serves its state from memory, and whatever
	// loads the record later finds what was last written
	// (durable-writes).
	AckUnsaved Bug = "ack-unsaved"
	// StaleStream: a sync-stream owner whose stream resumed from stored
	// state (a new activation after a move) answers a new subscriber
	// with its snapshot but never registers it for deltas, so every
	// subscription that followed its owner across a move goes silently
	// stale (stream-convergence).
	StaleStream Bug = "stale-stream"
	// ResendTimeout: the sender takes a leg that timed out as
	// resendable and sends the delivery again while its deadline allows,
	// although the callee may hold it (timeout-not-resent).
	ResendTimeout Bug = "resend-timeout"
	// ReleaseByAddress: a claim is released by its address, not by its
	// token — round 2's race: an activation being collected releases the
	// claim a newer activation of the address on the same node re-adopted,
	// deleting it under the newer one, which serves on with no claim
	// (claim-current, from the turns' claim-held records). Planted, the
	// release also runs ReleaseDelay late, as round 2's did.
	ReleaseByAddress Bug = "release-by-address"
)

// ReleaseDelay is how late a planted ReleaseByAddress release runs. Round
// 2's collection released its activations one after another, each behind
// the KV round trips of those before it, so a release ran long after its
// activation left the host and a next delivery's claim landed first; the
// collection now releases at once and in parallel, so the planted bug
// restores the delay, or the race it needs would rarely happen.
const ReleaseDelay = 50 * time.Millisecond

// EnvVar names the bugs switched on in a planted build.
const EnvVar = "NATSMESH_PLANT"
