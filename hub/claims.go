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
