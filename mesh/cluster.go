package mesh

import (
	"context"
	"fmt"
	"time"

	"github.com/natsmesh/natsmesh/mesh/directory"
	"github.com/natsmesh/natsmesh/mesh/membership"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// nodeResolver resolves through the node's current directory.
type nodeResolver struct{ n *Node }

func (r nodeResolver) Resolve(ctx context.Context, addr subjects.Address) (subjects.NodeID, error) {
	inc := r.n.current()
	if inc == nil || inc.dir == nil {
		return subjects.NodeID{}, &verdict.Error{Reason: verdict.ReasonDirectoryDown, Message: "node not joined"}
	}
	return inc.dir.Resolve(ctx, addr)
}

func (r nodeResolver) Invalidate(addr subjects.Address, node subjects.NodeID) {
	if inc := r.n.current(); inc != nil && inc.dir != nil {
		inc.dir.Invalidate(addr, node)
	}
}

// join registers a new generation, opens the directory and starts a host
// for it.
func (n *Node) join(ctx context.Context) (*incarnation, error) {
	mc := n.cfg.Membership
	m, err := membership.Join(ctx, membership.Config{
		Conn: n.conn, Prefix: n.prefix, Name: n.cfg.Name, Kinds: n.kindNames(), Version: Version,
		Heartbeat: mc.Heartbeat, TTL: mc.TTL, Replicas: mc.Replicas, AdvisorySubject: mc.AdvisorySubject,
		Logger: n.cfg.Logger,
	})
	if err != nil {
		return nil, fmt.Errorf("mesh: join: %w", err)
	}
	inc := &incarnation{id: m.Self().Node, members: m}
	dir, err := directory.Open(ctx, directory.Config{
		Conn: n.conn, Members: m, Prefix: n.prefix, Replicas: mc.Replicas, VerifyInterval: mc.VerifyInterval,
		Logger: n.cfg.Logger,
		OnLost: func(addr subjects.Address) {
			if h := inc.host; h != nil {
				h.Deactivate(addr)
			}
		},
	})
	if err != nil {
		m.Close()
		return nil, fmt.Errorf("mesh: directory: %w", err)
	}
	inc.dir = dir
	fence := func() error {
		if !m.Confirmed() {
			return verdict.New(verdict.ReasonHubShuttingDown, "node %s is fenced: its registration is not confirmed", inc.id)
		}
		return nil
	}
	h, err := n.newHost(inc.id, dir, fence, m.WaitConfirmed)
	if err != nil {
		dir.Close()
		m.Close()
		return nil, err
	}
	inc.host = h
	inc.stopEv = m.OnEvent(func(e membership.Event) {
		if e.Member.Node == inc.id {
			return
		}
		if e.Type.Departed() {
			n.departures.Add(1)
			n.Client.FailNode(e.Member.Node, e.Type.String())
		}
		if f := n.cfg.OnMembershipEvent; f != nil {
			f(e)
		}
	})
	if err := h.Start(); err != nil {
		inc.close()
		return nil, err
	}
	n.log.Info("joined the mesh", "generation", inc.id.String(), "members", len(m.Members()))
	return inc, nil
}

// fencing waits for the current generation to lose its registration (it
// was declared gone: a frozen process, a long partition, a newer generation
// of the name) and then drops its activations and rejoins with a fresh
// generation. The lost generation serves nothing meanwhile (its host's
// fence refuses every delivery).
func (n *Node) fencing() {
	defer n.wg.Done()
	for {
		inc := n.current()
		select {
		case <-n.ctx.Done():
			return
		case <-inc.members.Lost():
		}
		if inc.members.Superseded() {
			n.log.Error("a newer generation of this node's name registered: this process stands down", "generation", inc.id.String())
			inc.close()
			if f := n.cfg.OnFatal; f != nil {
				f(fmt.Errorf("mesh: generation %s superseded by a newer incarnation of %q", inc.id, inc.id.Name))
			}
			return
		}
		n.log.Warn("generation declared gone: dropping its activations and rejoining", "generation", inc.id.String())
		inc.close()
		for n.ctx.Err() == nil {
			ctx, cancel := context.WithTimeout(n.ctx, DefaultStartTimeout)
			next, err := n.join(ctx)
			cancel()
			if err == nil {
				n.mu.Lock()
				n.inc = next
				n.mu.Unlock()
				n.rejoins.Add(1)
				break
			}
			n.log.Warn("rejoin failed; retrying", "err", err)
			select {
			case <-n.ctx.Done():
				return
			case <-time.After(time.Second):
			}
		}
	}
}
