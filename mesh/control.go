package mesh

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strconv"
	"time"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/buildinfo"
	"github.com/natsmesh/natsmesh/mesh/directory"
	"github.com/natsmesh/natsmesh/mesh/hubstate"
	"github.com/natsmesh/natsmesh/mesh/membership"
	"github.com/natsmesh/natsmesh/mesh/reminders"
	"github.com/natsmesh/natsmesh/subjects"
)

// Version is the natsmesh release nodes announce (semantic versioning):
// buildinfo.Release, the first word of `meshd --version`.
const Version = buildinfo.Release

// ServiceName is the NATS micro service name every node registers, so
// `nats micro ls`, `nats micro info natsmesh` and `nats micro stats natsmesh`
// show the nodes.
const ServiceName = "natsmesh"

// Control endpoints, served by each node on <prefix>.ctl.<node-name>.<verb>;
// each answers JSON.
const (
	ControlPing  = "ping"  // NodeStatus
	ControlStats = "stats" // NodeStatus
	ControlHubs  = "hubs"  // HubsReport
	ControlDrain = "drain" // DrainReply, then the node drains
	// ControlState reads a hub's durable state for an operator: the
	// request is a StateQuery, the answer a StateReply. The node reads the
	// state bucket with its own permissions and answers only on a reply
	// subject it would answer any control request on, so an operator reads
	// state without any JetStream permission of its own (no JetStream
	// answer can be aimed into the mesh's buckets: SECURITY.md).
	ControlState = "state"
)

// StateQuery is the request of the state control endpoint.
type StateQuery struct {
	Address string `json:"address"`
}

// StateReply is a node's answer to a StateQuery. Found is false when the
// address has no stored state (Error empty); Error says why the read
// failed otherwise (an invalid address, a corrupt record, no state store,
// the bucket unreachable).
type StateReply struct {
	Node     string    `json:"node"`
	Address  string    `json:"address"`
	Found    bool      `json:"found"`
	Owner    string    `json:"owner,omitempty"`
	Epoch    uint64    `json:"epoch,omitempty"`
	Revision uint64    `json:"revision,omitempty"`
	Updated  time.Time `json:"updated,omitzero"`
	Data     []byte    `json:"data,omitempty"`
	Error    string    `json:"error,omitempty"`
}

// stateGetter is what the state endpoint needs of a state store
// (*hubstate.Store has it).
type stateGetter interface {
	Get(ctx context.Context, addr subjects.Address) (hub.StateRecord, error)
}

// readState answers a StateQuery from the node's state store, within
// DefaultStateReadTimeout.
func (n *Node) readState(body []byte) StateReply {
	r := StateReply{Node: n.ID().String()}
	var q StateQuery
	if err := json.Unmarshal(body, &q); err != nil {
		r.Error = "bad state query: " + err.Error()
		return r
	}
	r.Address = q.Address
	addr := subjects.Address(q.Address)
	if err := addr.Validate(); err != nil {
		r.Error = err.Error()
		return r
	}
	g, ok := n.StateStore().(stateGetter)
	if !ok || g == nil {
		r.Error = "this node has no durable state store"
		return r
	}
	ctx, cancel := context.WithTimeout(context.Background(), DefaultStateReadTimeout)
	defer cancel()
	rec, err := g.Get(ctx, addr)
	switch {
	case errors.Is(err, hubstate.ErrNotFound):
		return r
	case err != nil:
		r.Error = err.Error()
		return r
	}
	r.Found, r.Epoch, r.Revision, r.Updated, r.Data = true, rec.Epoch, rec.Revision, rec.Updated, rec.Data
	if !rec.Owner.IsZero() {
		r.Owner = rec.Owner.String()
	}
	return r
}

// DefaultStateReadTimeout bounds a read of the state endpoint.
const DefaultStateReadTimeout = 5 * time.Second

// ControlSubject returns <prefix>.ctl.<name>.<verb>.
func (n *Node) ControlSubject(verb string) string {
	return n.prefix.Control(n.cfg.Name, verb)
}

// Metadata keys of the micro service.
const (
	MetaNode   = "node"   // "name.gen"
	MetaPrefix = "prefix" // subject prefix
)

// NodeStatus is a node's identity and counters, as served by the ping and
// stats control endpoints.
type NodeStatus struct {
	Node       string      `json:"node"`
	Name       string      `json:"name"`
	Generation uint64      `json:"generation"`
	Prefix     string      `json:"prefix"`
	Version    string      `json:"version"`
	Build      string      `json:"build,omitempty"` // the binary's module version and VCS revision (build info)
	Started    time.Time   `json:"started"`
	Kinds      []string    `json:"kinds"`
	Draining   bool        `json:"draining"`
	Host       hub.Stats   `json:"host"` // counters across the node's generations; gauges and Node of the current one
	Client     ClientStats `json:"client"`
	Saturation Saturation  `json:"saturation"`
	Ingress    int64       `json:"ingress"` // ingress messages taken
	// IngressRefused counts ingress and control requests dropped unanswered
	// because their reply subject is one a node must never publish to
	// (SECURITY.md).
	IngressRefused int64 `json:"ingress_refused"`
	// IngressInboxRefused counts those of IngressRefused that were ingress
	// requests refused by the reply rules: a reply under the nodes' own
	// inbox, or under a client user's inbox prefix in a shape that is not
	// that user's (NodeConfig.ClientInboxes).
	IngressInboxRefused int64 `json:"ingress_inbox_refused"`
	// IngressNodeOnly counts ingress deliveries refused bad-request for a
	// node-only type (the sync-stream protocol's) or an internal kind, or
	// for carrying Nats-Request-Info more than once.
	IngressNodeOnly int64 `json:"ingress_node_only"`
	// IngressShares are the fair shares of the ingress slots and
	// placement waits (NodeConfig.IngressCallerShare).
	IngressShares IngressShares `json:"ingress_shares"`
	// With membership: the registry as this node sees it, departures of
	// other generations it observed, times it was fenced and rejoined, and
	// the addresses it holds claims on.
	Membership *MembershipStatus `json:"membership,omitempty"`
	// Reminders counts the reminder fires this node's runner delivered,
	// dropped (cancelled or replaced), retried and recorded as failed.
	Reminders reminders.RunnerStats `json:"reminders"`
}

// MembershipStatus is a node's view of the membership.
type MembershipStatus struct {
	Members    []membership.Member `json:"members"`
	Departures int64               `json:"departures"`
	Rejoins    int64               `json:"rejoins"`
	// Fenced counts the times a generation of this node was declared gone
	// (it served nothing from then on, then rejoined or stood down);
	// Superseded the times a newer generation of the name took over.
	Fenced     int64 `json:"fenced"`
	Superseded int64 `json:"superseded"`
	Claims     int   `json:"claims"`
	// Registry and Directory count entries this session refused or found
	// overwritten by another writer (SECURITY.md); they restart at zero
	// with each session.
	Registry  membership.Stats `json:"registry"`
	Directory directory.Stats  `json:"directory"`
}

// HubsReport lists a node's hub kinds and live activations.
type HubsReport struct {
	Node        string   `json:"node"`
	Kinds       []string `json:"kinds"`
	Activations int      `json:"activations"`
	// Addresses are the activated addresses, sorted, at most MaxListed.
	Addresses []string `json:"addresses"`
	Truncated bool     `json:"truncated"`
}

// MaxListed bounds the addresses a HubsReport lists.
const MaxListed = 1000

// DrainReply acknowledges a drain request; the drain runs after the reply.
type DrainReply struct {
	Node     string `json:"node"`
	Draining bool   `json:"draining"`
}

// Status returns the node's identity and counters.
func (n *Node) Status() NodeStatus {
	kinds := n.kindNames()
	slices.Sort(kinds)
	hs := n.hostStats()
	id := n.ID() // one read: a rejoin between two would mix generations
	return NodeStatus{
		Node: id.String(), Name: n.cfg.Name, Generation: id.Generation,
		Prefix: string(n.prefix), Version: Version, Build: buildinfo.Read().Short(), Started: n.started, Kinds: kinds,
		Draining: n.draining.Load(), Host: hs, Client: n.Client.Stats(),
		Saturation: n.Client.Saturation(), Ingress: n.ingressCount.Load(), IngressRefused: n.badReplies.Load(), IngressInboxRefused: n.inboxReplies.Load(), IngressNodeOnly: n.refusedNodeOnly.Load(),
		IngressShares: n.ingressShares(),
		Membership:    n.membershipStatus(), Reminders: n.ReminderStats(),
	}
}

func (n *Node) membershipStatus() *MembershipStatus {
	inc := n.current()
	if inc == nil || inc.members == nil {
		return nil
	}
	return &MembershipStatus{
		Members: inc.members.Members(), Departures: n.departures.Load(), Rejoins: n.rejoins.Load(), Claims: inc.dir.Owned(),
		Fenced: n.fenced.Load(), Superseded: n.superseded.Load(),
		Registry: inc.members.Stats(), Directory: inc.dir.Stats(),
	}
}

// Hubs returns the node's kinds and activations.
func (n *Node) Hubs() HubsReport {
	kinds := n.kindNames()
	slices.Sort(kinds)
	var addrs []subjects.Address
	sess := n.Session() // the addresses and the generation they are listed under, of one session
	if sess.Host != nil {
		addrs = sess.Host.Addresses()
	}
	r := HubsReport{Node: sess.ID.String(), Kinds: kinds, Activations: len(addrs)}
	slices.Sort(addrs)
	if len(addrs) > MaxListed {
		addrs, r.Truncated = addrs[:MaxListed], true
	}
	for _, a := range addrs {
		r.Addresses = append(r.Addresses, string(a))
	}
	return r
}

// serveControl registers session inc's control service: the node as a
// NATS micro service with its control endpoints (controlService: every
// answer, discovery included, only on a safe reply subject), its metadata
// naming inc's generation. The session owns it: session.close stops it
// (a rejoin's old session, Close, Drain), and stopServing stops the
// current one for good. A session already closed, or a node that stopped
// serving, gets none.
func (n *Node) serveControl(inc *session) error {
	n.svcMu.Lock()
	defer n.svcMu.Unlock()
	if n.svcStopped {
		return nil
	}
	id := inc.id // the metadata names one generation
	svc, err := newControlService(n.conn, n.safeReply, Version, "natsmesh node "+id.String(), map[string]string{
		MetaNode:     id.String(),
		MetaPrefix:   string(n.prefix),
		"name":       n.cfg.Name,
		"generation": strconv.FormatUint(id.Generation, 10),
	})
	if err != nil {
		return err
	}
	for _, e := range []struct {
		verb string
		h    func([]byte) (any, error)
		then func()
	}{
		{ControlPing, func([]byte) (any, error) { return n.Status(), nil }, nil},
		{ControlStats, func([]byte) (any, error) { return n.Status(), nil }, nil},
		{ControlHubs, func([]byte) (any, error) { return n.Hubs(), nil }, nil},
		{ControlState, func(b []byte) (any, error) { return n.readState(b), nil }, nil},
		{ControlReminders, n.serveReminders, nil},
		{ControlDrain, func([]byte) (any, error) { return DrainReply{Node: n.ID().String(), Draining: true}, nil }, func() { go n.onDrain() }},
	} {
		if err := svc.addEndpoint(e.verb, n.ControlSubject(e.verb), e.h, e.then); err != nil {
			svc.stop()
			return err
		}
	}
	if !inc.setControl(svc) {
		svc.stop() // the session closed meanwhile
	}
	return nil
}

// onDrain runs a drain requested over the control subject.
func (n *Node) onDrain() {
	if f := n.cfg.OnDrainRequest; f != nil {
		f()
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), DefaultDrainTimeout)
	defer cancel()
	if err := n.Drain(ctx); err != nil {
		n.log.Warn("drain requested over control ended early", "err", err)
	}
}

// DefaultDrainTimeout bounds a drain requested over the control subject when
// NodeConfig.OnDrainRequest is nil.
const DefaultDrainTimeout = 30 * time.Second
