package mesh

import (
	"context"

	"github.com/natsmesh/natsmesh/subjects"
)

// Resolver maps an address to the node generation that owns it (DESIGN §5).
// The sender calls Resolve afresh before every attempt and Invalidate when a
// delivery to node met NATS no responders or "not the owner", so a cached
// entry never outlives the owner it names. Implementations must be safe for
// concurrent use; Resolve may block (a directory read) and must honour ctx.
// A Resolve error is a verdict error: verdict.ErrNoPlacement when no live node
// hosts the kind, verdict.ErrDirectoryUnavailable when the directory cannot
// be read.
type Resolver interface {
	Resolve(ctx context.Context, addr subjects.Address) (subjects.NodeID, error)
	Invalidate(addr subjects.Address, node subjects.NodeID)
}

// Redirector is implemented by a Resolver that can learn an address's
// owner from a refusal: a node that refuses a delivery "not the owner"
// names the live owner (verdict.Error.Node), and the sender re-sends to it
// at once, without a back-off, if Redirect reports true (DESIGN §5). A
// Resolver that places without reading the directory must implement it.
type Redirector interface {
	Redirect(addr subjects.Address, owner subjects.NodeID) bool
}

// cachedResolver is a Resolver that can name an address's owner from
// memory, without blocking: the sender then prepares a delivery's leg before
// its turn in the lane (stage). A miss (false) is answered by Resolve.
type cachedResolver interface {
	Cached(addr subjects.Address) (subjects.NodeID, bool)
}

// ownerLearner is a Resolver that caches an owner learnt from an
// acceptance: node accepted a delivery to addr, which it does only while it
// holds addr's claim. Learn must not block and must keep an owner already
// cached (a redirect may be fresher).
type ownerLearner interface {
	Learn(addr subjects.Address, node subjects.NodeID)
}

// StaticResolver resolves every address to one node generation: the resolver
// of a one-node mesh.
type StaticResolver struct{ Node subjects.NodeID }

// Resolve returns r.Node.
func (r StaticResolver) Resolve(context.Context, subjects.Address) (subjects.NodeID, error) {
	return r.Node, nil
}

// Cached returns r.Node: the owner is always known.
func (r StaticResolver) Cached(subjects.Address) (subjects.NodeID, bool) { return r.Node, true }

// Invalidate does nothing: there is no cache.
func (StaticResolver) Invalidate(subjects.Address, subjects.NodeID) {}

// ResolverFunc adapts a function to a Resolver with no cache.
type ResolverFunc func(ctx context.Context, addr subjects.Address) (subjects.NodeID, error)

// Resolve calls f.
func (f ResolverFunc) Resolve(ctx context.Context, addr subjects.Address) (subjects.NodeID, error) {
	return f(ctx, addr)
}

// Invalidate does nothing.
func (ResolverFunc) Invalidate(subjects.Address, subjects.NodeID) {}
