package mesh

import (
	"context"

	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// The cluster view (DESIGN §9): who is alive and what they host is the
// current session's membership (package membership), and where an address
// lives is its directory (package directory). The sender resolves through
// nodeResolver, the ingress and the subscriptions read Node.Members, and
// the directory reads the same membership: one store of liveness, replaced
// with the session on a rejoin.

// nodeResolver resolves through the current session's directory.
type nodeResolver struct{ n *Node }

func (r nodeResolver) Resolve(ctx context.Context, addr subjects.Address) (subjects.NodeID, error) {
	inc := r.n.current()
	if inc == nil || inc.dir == nil {
		return subjects.NodeID{}, &verdict.Error{Reason: verdict.ReasonDirectoryDown, Message: "node not joined"}
	}
	return inc.dir.Resolve(ctx, addr)
}

// Cached answers from the current session's directory cache (Directory.Cached).
func (r nodeResolver) Cached(addr subjects.Address) (subjects.NodeID, bool) {
	if inc := r.n.current(); inc != nil && inc.dir != nil {
		return inc.dir.Cached(addr)
	}
	return subjects.NodeID{}, false
}

func (r nodeResolver) Invalidate(addr subjects.Address, node subjects.NodeID) {
	if inc := r.n.current(); inc != nil && inc.dir != nil {
		inc.dir.Invalidate(addr, node)
	}
}

// Learn caches an owner learnt from an acceptance in the current
// session's directory (Directory.Learn).
func (r nodeResolver) Learn(addr subjects.Address, node subjects.NodeID) {
	if inc := r.n.current(); inc != nil && inc.dir != nil {
		inc.dir.Learn(addr, node)
	}
}

func (r nodeResolver) Redirect(addr subjects.Address, owner subjects.NodeID) bool {
	if inc := r.n.current(); inc != nil && inc.dir != nil {
		return inc.dir.Redirect(addr, owner)
	}
	return false
}

// Gone reports whether the cluster view knows node gone (a newer generation
// of its name is live, or it departed within the fencing delay; see
// membership.Membership.Gone). False without membership. Safe for
// concurrent use; it is what the sending side should ask instead of keeping
// departure marks of its own.
func (n *Node) Gone(node subjects.NodeID) bool {
	if inc := n.current(); inc != nil && inc.members != nil {
		return inc.members.Gone(node)
	}
	return false
}
