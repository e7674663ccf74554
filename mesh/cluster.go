package mesh

import (
	"context"

	"github.com/natsmesh/natsmesh/mesh/membership"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// The cluster view (DESIGN §9): who is alive and what they host is the
// current session's membership (package membership, the one store of
// liveness), and where an address lives is its directory (package
// directory). The sender reads it through ClusterView (a Node passes
// itself: Node.Gone asks its current session's membership) and resolves
// through nodeResolver; the ingress forwards through the node's sender, so
// it reads the same view; the subscriptions read Session.Members and the
// directory the same membership — replaced with the session on a rejoin.
// A standalone client reads membership.Static: it sees no departure.

// ClusterView is what the sender reads of the cluster view
// (membership.View, which every view implements): whether an owner
// generation is known gone. The sender asks it each time it addresses a
// delivery to an owner, and keeps no departure marks of its own. A
// departure's event reaches the sender through failNode, which the owner of
// the view calls (a Node: its session's membership events).
type ClusterView interface {
	// Gone reports whether node is known gone (departed, or superseded
	// by a newer generation of its name). Safe for concurrent use; it
	// must not block on NATS.
	Gone(node subjects.NodeID) bool
}

var (
	_ ClusterView = membership.View(nil)
	_ ClusterView = (*Node)(nil)
)

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
// membership.Membership.Gone), asking the current session's membership: it
// follows the node across rejoins. False without membership. Safe for
// concurrent use; it makes the Node the ClusterView of its own sender.
func (n *Node) Gone(node subjects.NodeID) bool {
	if inc := n.current(); inc != nil && inc.members != nil {
		return inc.members.Gone(node)
	}
	return false
}
