package hub

import (
	"context"

	"github.com/natsmesh/natsmesh/subjects"
)

// Claims is the seam for single activation across nodes (DESIGN §5): before a
// node activates an address it claims it. The membership layer implements it
// with the KV directory; a nil Claims means this node owns every address
// (one node). Implementations must be safe for concurrent use.
//
// Claims are tokens, not names (DESIGN §5, round 3): every claim this node
// takes, or re-adopts, gets a ClaimToken of its own, and the activation
// built on it is the only one that holds it. Release and stand-down name
// the token, so an older activation of the same address on this node can
// never release or stand down a claim a newer activation took.
type Claims interface {
	// Claim makes node the owner of addr and returns the token of its
	// claim, or returns the live owner that holds it (Grant.Owner !=
	// node, zero Token, nil error). An error means the directory could
	// not be read or written (the delivery is refused ShuttingDown).
	Claim(ctx context.Context, addr subjects.Address) (Grant, error)
	// Release gives up the claim t on deactivation. A token that is no
	// longer the address's current claim on this node (a newer
	// activation claimed it since) releases nothing.
	Release(t ClaimToken)
}

// PipelinedClaims is a Claims that can also start the plain case of a
// claim — the address has no claim at all, and one write makes it this
// node's — without a goroutine of the caller's waiting for it (DESIGN §5,
// "Claims pipelined"). A storm of cold addresses then costs the host no
// goroutine, semaphore wake-up or request round trip per address: the
// writes go out as they come, and their acknowledgements settle them on the
// implementation's goroutine.
type PipelinedClaims interface {
	Claims
	// TryClaim starts the plain case of a claim of addr and returns without
	// blocking. It calls done exactly once, never before it returned and
	// never on the caller's goroutine: with the grant (ok, Grant.Owner this
	// node, a token) when the plain case applied, or with ok false when it
	// did not or could not be told (the address is claimed already, a
	// released claim's marker is in the way, the write failed, ctx ended
	// first). ok false says nothing about the address: the caller runs
	// Claim for the whole claim — a plain write that landed unseen is this
	// node's and Claim re-adopts it. done must not block: it runs on the
	// goroutine that settles every pipelined claim.
	TryClaim(ctx context.Context, addr subjects.Address, done func(g Grant, ok bool))
}

// Grant is what a claim returned: the owner, and when that is this node,
// the token of the claim.
type Grant struct {
	Owner subjects.NodeID
	Token ClaimToken
}

// ClaimToken names one claim a Claims implementation issued: the address,
// an identity unique to the claim within the issuing node, and the KV
// revision the claim was written at when it was issued (the directory may
// re-write it later under the same identity). The zero value names no
// claim.
type ClaimToken struct {
	Addr subjects.Address
	ID   uint64
	Rev  uint64
}

// IsZero reports whether t names no claim.
func (t ClaimToken) IsZero() bool { return t.ID == 0 }
