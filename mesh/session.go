package mesh

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/mesh/directory"
	"github.com/natsmesh/natsmesh/mesh/hubstate"
	"github.com/natsmesh/natsmesh/mesh/membership"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// session is everything stamped with one node generation (DESIGN §1): the
// generation's delivery subscription and its host (activations, their
// claims through the directory), its registration, its directory handle,
// its watcher of membership events, and the control service whose
// metadata names the generation (Node.serveControl). A rejoin ends one session (close) and starts the next
// (join); the node reads the current one through Node.current and caches
// none of its parts. Consumers take one snapshot of it (Node.Session) and
// re-arm when its done channel closes (package syncstream).
// The node's client is node-wide (its lanes and flights outlive a rejoin),
// but its identity and answer subject are the session's: join binds them
// (Client.bindIdentity).
type session struct {
	id      subjects.NodeID
	host    *hub.Host
	members *membership.Membership
	dir     *directory.Directory
	stopEv  func()
	// announced is the kind list the registry entry carries (what join
	// registered, then each SetKinds of Node.applyKinds); guarded by the
	// node's kindsMu.
	announced []string

	// svc is the session's control service (Node.serveControl), nil
	// before it is served and once it is stopped; svcDone: stopped for
	// good (the session closed).
	svcMu   sync.Mutex
	svc     *controlService
	svcDone bool

	closeOnce sync.Once
	// done is closed by retire: the node moved on to the next session
	// (a rejoin, once it is installed) or stopped (Close, Drain).
	done      chan struct{}
	retireOne sync.Once
}

func newSession() *session { return &session{done: make(chan struct{})} }

// retire closes done once: consumers holding this session re-arm on the
// node's current one. Called after the next session is installed, or when
// the node stops.
func (inc *session) retire() { inc.retireOne.Do(func() { close(inc.done) }) }

// setControl gives the session its control service, unless it closed
// (then it reports false and the caller stops svc).
func (inc *session) setControl(svc *controlService) bool {
	inc.svcMu.Lock()
	defer inc.svcMu.Unlock()
	if inc.svcDone {
		return false
	}
	inc.svc = svc
	return true
}

// stopControl stops the session's control service, for good.
func (inc *session) stopControl() {
	inc.svcMu.Lock()
	svc := inc.svc
	inc.svc, inc.svcDone = nil, true
	inc.svcMu.Unlock()
	if svc != nil {
		svc.stop()
	}
}

// close ends the session, once, for every path that ends one: Close and a
// fenced generation (leave nil), a failed join (the parts it got), Drain
// (leave is its graceful leave). Without leave the host closes first: its
// queue fails late ShuttingDown and its activations release their claims
// while the directory is still open; the registration is left to expire.
// With leave (the host already drained, its claims released) the
// registration is deleted through leave, and the host closes last: until
// the generation has left it answers duplicates of what it accepted from
// its dedupe window.
func (inc *session) close(leave func(*membership.Membership)) {
	inc.closeOnce.Do(func() {
		inc.stopControl() // its metadata names this generation
		if leave == nil && inc.host != nil {
			inc.host.Close()
		}
		if inc.stopEv != nil {
			inc.stopEv()
		}
		if inc.dir != nil {
			inc.dir.Close()
		}
		if inc.members != nil {
			if leave != nil {
				leave(inc.members)
			}
			inc.members.Close()
		}
		if leave != nil && inc.host != nil {
			inc.host.Close()
		}
	})
}

// join starts a new generation: it subscribes the generation's delivery
// subject (join order: before the generation is announced, so a sender that
// reads it from the registry never meets no responders), registers it,
// opens the directory, and then lets the host serve. lost is the
// generation a rejoin follows (its activations dropped), zero for the
// first join.
func (n *Node) join(ctx context.Context, lost subjects.NodeID) (*session, error) {
	mc := n.cfg.Membership
	if err := n.openState(ctx); err != nil {
		return nil, err
	}
	if err := n.openReminders(ctx); err != nil {
		return nil, err
	}
	inc := newSession()
	claims := &lateClaims{}
	// The host exists before the membership does (join order): until
	// Join returns it is fenced.
	var mmu sync.Mutex
	var members *membership.Membership
	joined := make(chan struct{}) // closed once members is set
	current := func() *membership.Membership {
		mmu.Lock()
		defer mmu.Unlock()
		return members
	}
	// Intake: refuse before the generation is announced and once it is
	// lost; meanwhile accept, even unconfirmed after a reconnect (the
	// deliveries park until turns may start, instead of their senders
	// backing off through a registry's leader election).
	fence := func() error {
		if m := current(); m == nil || m.IsLost() {
			return verdict.New(verdict.ReasonHubShuttingDown, "node %s is fenced: its registration is lost or not yet announced", n.cfg.Name)
		}
		return nil
	}
	// Turns: only while the link is up and the registration confirmed on
	// it (self-fencing).
	turnFence := func() error {
		if m := current(); m == nil || !m.Confirmed() {
			return verdict.New(verdict.ReasonHubShuttingDown, "node %s is fenced: its registration is not confirmed", n.cfg.Name)
		}
		return nil
	}
	await := func(ctx context.Context) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-joined:
		}
		return current().WaitConfirmed(ctx)
	}
	inc.announced = n.kindNames()
	m, err := membership.Join(ctx, membership.Config{
		Conn: n.conn, Prefix: n.prefix, Name: n.cfg.Name, Kinds: inc.announced, Version: Version, Clock: n.Clock(),
		Heartbeat: mc.Heartbeat, TTL: mc.TTL, FencingDelay: mc.FencingDelay, Replicas: mc.Replicas, PlacementCluster: mc.PlacementCluster,
		// A rejoin supersedes only this process's own lost generation
		// (Rejoin): a newer generation of the name that heartbeats is a
		// process that took the name over while this one was gone, and
		// this one stands down (fencing) — with Replace it took the name
		// back from the live replacement (a fresh-user trial: a frozen
		// meshd, woken after its replacement joined, saw its loss before
		// the supersede and rejoined over it). --replace is for a first
		// join only.
		AdvisorySubject: mc.AdvisorySubject, Replace: mc.Replace && lost.IsZero(), Rejoin: lost,
		Subscriber:   mc.Subscriber,
		Predecessors: mc.Predecessors,
		Logger:       n.cfg.Logger,
		BeforeAnnounce: func(id subjects.NodeID) (func(), error) {
			if f := mc.OnGeneration; f != nil {
				if err := f(id); err != nil {
					return nil, err
				}
			}
			h, err := n.newHost(id, claims, fence, turnFence, await)
			if err != nil {
				return nil, err
			}
			if err := h.Start(); err != nil {
				h.Close()
				return nil, err
			}
			// The node's own deliveries go out under the session's
			// identity and answer subject (DESIGN §1).
			if err := n.Client.bindIdentity(id); err != nil {
				h.Close()
				return nil, err
			}
			inc.id, inc.host = id, h
			return func() { h.Close(); inc.host = nil }, nil
		},
	})
	if err != nil {
		return nil, fmt.Errorf("mesh: join: %w", err)
	}
	mmu.Lock()
	members = m
	mmu.Unlock()
	close(joined)
	inc.members = m
	// Departures reach the sender from here on, the directory's opening
	// included: a departure seen while it opens is not lost.
	inc.stopEv = m.OnEvent(func(e membership.Event) {
		if e.Member.Node == inc.id {
			return
		}
		switch {
		case e.Type.Departed():
			n.departures.Add(1)
			n.Client.failNode(e.Member.Node, e.Type.String())
		case e.Type == membership.Moved:
			n.Client.ownerMoved(e.Member.Node, fmt.Errorf("owner %s's connection moved (%s) with the leg in flight: %w", e.Member.Node, e.Reason, nats.ErrDisconnected))
		}
		if f := n.cfg.OnMembershipEvent; f != nil {
			f(e)
		}
	})
	dir, err := directory.Open(ctx, directory.Config{
		Conn: n.conn, Members: m, Prefix: n.prefix, Replicas: mc.Replicas, PlacementCluster: mc.PlacementCluster, VerifyInterval: mc.VerifyInterval,
		Logger: n.cfg.Logger, Clock: n.Clock(),
		OnLost: func(t hub.ClaimToken) {
			if h := inc.host; h != nil {
				h.StandDown(t) // the activation holding t only; never waits on its turn
			}
		},
	})
	if err != nil {
		inc.close(nil) // the host and the registration: all it got
		return nil, fmt.Errorf("mesh: directory: %w", err)
	}
	inc.dir = dir
	claims.set(dir)
	nodes, subscribers := 0, 0
	for _, mb := range m.Members() {
		if mb.Subscriber {
			subscribers++
		} else {
			nodes++
		}
	}
	// Counted as meshctl nodes counts them: subscribers (meshctl
	// subscribe's processes) apart.
	n.log.Info("joined the mesh", "generation", inc.id.String(), "members", nodes, "subscribers", subscribers)
	return inc, nil
}

// openState binds the durable state bucket once (DESIGN §7a), unless the
// host was given a store or the membership config disables it.
func (n *Node) openState(ctx context.Context) error {
	mc := n.cfg.Membership
	n.mu.RLock()
	done := n.state != nil
	n.mu.RUnlock()
	if done || mc.DisableState || n.cfg.Host.State != nil {
		return nil
	}
	replicas := mc.StateReplicas
	if replicas == 0 {
		replicas = mc.Replicas
	}
	var st *hubstate.Store
	err := membership.RetryEach(ctx, n.cfg.Logger, "bind the durable state bucket "+hubstate.BucketName(n.prefix), func(ctx context.Context) (err error) {
		st, err = hubstate.Open(ctx, hubstate.Config{Conn: n.conn, Prefix: n.prefix, Replicas: replicas, PlacementCluster: mc.PlacementCluster, MaxValueSize: mc.StateMaxValueSize, Logger: n.cfg.Logger, Clock: n.Clock()})
		return err
	})
	if err != nil {
		return fmt.Errorf("mesh: state bucket: %w", err)
	}
	n.mu.Lock()
	n.state = st
	n.mu.Unlock()
	return nil
}

// lateClaims is the host's claims seam before the directory is open (the
// host subscribes before the generation is announced): until then nobody
// has read the generation, and a claim fails resendable.
type lateClaims struct {
	mu  sync.RWMutex
	dir *directory.Directory
}

func (c *lateClaims) set(d *directory.Directory) {
	c.mu.Lock()
	c.dir = d
	c.mu.Unlock()
}

func (c *lateClaims) get() *directory.Directory {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.dir
}

func (c *lateClaims) Claim(ctx context.Context, addr subjects.Address) (hub.Grant, error) {
	d := c.get()
	if d == nil {
		return hub.Grant{}, errors.New("directory not open yet")
	}
	return d.Claim(ctx, addr)
}

// TryClaim is the directory's (hub.PipelinedClaims); before it is open
// the plain case does not apply (the host's Claim then fails resendable).
func (c *lateClaims) TryClaim(ctx context.Context, addr subjects.Address, done func(hub.Grant, bool)) {
	d := c.get()
	if d == nil {
		go done(hub.Grant{}, false)
		return
	}
	d.TryClaim(ctx, addr, done)
}

func (c *lateClaims) Release(t hub.ClaimToken) {
	if d := c.get(); d != nil {
		d.Release(t)
	}
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
		n.fenced.Add(1)
		if inc.members.Superseded() {
			n.superseded.Add(1)
			n.log.Error("a newer generation of this node's name registered: this process stands down", "generation", inc.id.String())
			inc.close(nil)
			if f := n.cfg.OnFatal; f != nil {
				f(fmt.Errorf("mesh: generation %s superseded by a newer incarnation of %q", inc.id, inc.id.Name))
			}
			return
		}
		// The generations this node's work is addressed to now: a departure
		// of one of them between this session's close and the next
		// session's watch is seen by neither (failGoneDuringRejoin).
		addressed := n.Client.addressedNodes()
		inc.close(nil)
		if n.draining.Load() {
			// A draining node leaves: it does not come back under a
			// new generation that would take placements while it
			// drains (and stay registered after it).
			n.log.Warn("generation declared gone while draining: its activations dropped; not rejoining", "generation", inc.id.String())
			return
		}
		n.log.Warn("generation declared gone: dropping its activations and rejoining", "generation", inc.id.String())
		for n.ctx.Err() == nil && !n.draining.Load() {
			ctx, cancel := context.WithTimeout(n.ctx, DefaultStartTimeout)
			next, err := n.join(ctx, inc.id)
			cancel()
			if errors.Is(err, membership.ErrNameInUse) {
				// A newer process of this name heartbeats: it took the
				// name over while this one was gone. Stand down, as
				// when the supersede is seen first.
				n.superseded.Add(1)
				n.log.Error("a newer generation of this node's name is live: this process stands down", "generation", inc.id.String(), "err", err)
				if f := n.cfg.OnFatal; f != nil {
					f(fmt.Errorf("mesh: generation %s superseded by a newer incarnation of %q: %w", inc.id, inc.id.Name, err))
				}
				return
			}
			if err == nil {
				n.mu.Lock()
				addStats(&n.ended, inc.host.Stats()) // with the swap: Status counts it once
				n.inc = next
				n.mu.Unlock()
				n.installKinds()
				// And what was addressed during the rejoin (through the
				// old session's directory cache, to generations the old
				// view knew).
				n.failGoneDuringRejoin(append(addressed, n.Client.addressedNodes()...), next)
				n.rejoins.Add(1)
				if !n.cfg.DisableControl {
					if err := n.serveControl(next); err != nil { // its metadata names the new generation
						n.log.Warn("control service not served for the new session", "err", err)
					}
				}
				inc.retire() // its consumers re-arm on next
				break
			}
			n.log.Warn("rejoin failed; retrying", "err", err)
			select {
			case <-n.ctx.Done():
				return
			case <-n.Clock().After(time.Second):
			}
		}
	}
}

// failGoneDuringRejoin fails the work addressed to generations that
// departed while this node rejoined, which neither session reported: the
// old one's watch was closed, and the new one's registry read (a rejoin's
// join) does not hold them, so it never emits their departure. addressed
// are the generations work was addressed to when the old session closed
// and when next was installed; each was resolved through the old session
// (its view, its directory cache), so it registered before next's registry
// read began: one that is not next's live generation of its name then is
// gone (deleted, expired, marked removed or superseded), and failNode gives
// its work the departed verdicts at once (DESIGN §4) instead of its legs'
// timeouts. This node's own previous generation is one of them. (A
// generation the old session learnt only from a redirect during the rejoin
// could have registered after next's read began; next's watch has applied
// its entry by the time the directory opened, in all but a pathological
// delay.)
func (n *Node) failGoneDuringRejoin(addressed []subjects.NodeID, next *session) {
	for _, node := range addressed {
		if node == next.id || next.members.Alive(node) {
			continue
		}
		if node.Name != next.id.Name { // its own previous generation is no peer's departure
			n.departures.Add(1)
		}
		n.Client.failNode(node, "departed while this node rejoined")
	}
}
