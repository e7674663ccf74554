package hub

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nuid"

	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// HeaderChain carries a request's call chain (DESIGN §13): the addresses
// whose turns are waiting on it, outermost first, behind the chain's ID:
// "<id> <address token> <address token> ..." (tokens as in
// subjects.EncodeToken). A mesh sender sets it on a Request sent from a
// hub's turn ([ChainOf]); the ingress forwards none from clients.
const HeaderChain = "Mesh-Chain"

// MaxChain bounds the addresses of a call chain; a Request from a turn
// whose chain is that deep fails with verdict.ErrBadRequest before it is
// sent.
const MaxChain = 32

// maxChainIDLen bounds a chain ID.
const maxChainIDLen = 64

// Chain is a request's call chain: the addresses whose turns wait on it,
// outermost first, and the ID naming the chain (the same all along it).
// The zero Chain is no chain (a request not sent from a turn).
type Chain struct {
	ID        string
	Addresses []subjects.Address
}

// Has reports whether addr is waiting in the chain.
func (c Chain) Has(addr subjects.Address) bool {
	for _, a := range c.Addresses {
		if a == addr {
			return true
		}
	}
	return false
}

// String returns the HeaderChain value of c ("" for no chain).
func (c Chain) String() string {
	if c.ID == "" {
		return ""
	}
	var b strings.Builder
	b.WriteString(c.ID)
	for _, a := range c.Addresses {
		b.WriteByte(' ')
		b.WriteString(subjects.EncodeToken(string(a)))
	}
	return b.String()
}

// ParseChain reads a HeaderChain value. The error matches
// verdict.ErrBadRequest.
func ParseChain(v string) (Chain, error) {
	f := strings.Fields(v)
	if len(f) < 2 || len(f) > MaxChain+1 || len(f[0]) > maxChainIDLen {
		return Chain{}, verdict.New(verdict.ReasonBadRequest, "header %s: want an ID (at most %d bytes) and 1-%d address tokens", HeaderChain, maxChainIDLen, MaxChain)
	}
	c := Chain{ID: f[0], Addresses: make([]subjects.Address, 0, len(f)-1)}
	for _, t := range f[1:] {
		s, err := subjects.DecodeToken(t)
		if err == nil {
			err = subjects.Address(s).Validate()
		}
		if err != nil {
			return Chain{}, verdict.New(verdict.ReasonBadRequest, "header %s: %v", HeaderChain, err)
		}
		c.Addresses = append(c.Addresses, subjects.Address(s))
	}
	return c, nil
}

// Reentrant is implemented by hubs whose kind lets a request of its own
// call chain in while a turn of that chain waits (A → B → A runs the
// inner A at once, beside the waiting turn, as Orleans and GoAkt allow):
// without it such a request is refused with verdict.ErrCallCycle instead of
// deadlocking. Reentrant is asked once, when the activation is built. A
// reentrant hub's turns must tolerate running inside one another's waits.
type Reentrant interface {
	Hub
	Reentrant() bool
}

// turnInfo is what a turn's ctx knows about the turn for ChainOf.
type turnInfo struct {
	addr  subjects.Address
	chain Chain // the chain of the delivery (or batch) the turn handles
	once  sync.Once
	id    string
	ended atomic.Bool // the turn returned: its address waits on nothing any more
}

// chainID returns the turn's chain ID: its delivery's, or a fresh one for a
// turn no chain reached (made once, on first use).
func (t *turnInfo) chainID() string {
	t.once.Do(func() {
		t.id = t.chain.ID
		if t.id == "" {
			t.id = nuid.Next()
		}
	})
	return t.id
}

type turnKey struct{}

// ChainOf returns the call chain a Request sent with ctx travels with:
// when ctx is (derived from) a hub turn's and that turn is still running,
// the chain of the delivery the turn handles with the turn's own address
// appended; otherwise false. The
// mesh sender calls it for every Request.
func ChainOf(ctx context.Context) (Chain, bool) {
	t, ok := ctx.Value(turnKey{}).(*turnInfo)
	if !ok || t.ended.Load() {
		// Not a turn's, or its turn returned (a goroutine kept its ctx):
		// no address of the chain waits on what is sent with it.
		return Chain{}, false
	}
	out := Chain{ID: t.chainID(), Addresses: make([]subjects.Address, 0, len(t.chain.Addresses)+1)}
	out.Addresses = append(append(out.Addresses, t.chain.Addresses...), t.addr)
	return out, true
}

// withTurn returns ctx carrying the turn of addr over deliveries ds.
func withTurn(ctx context.Context, addr subjects.Address, ds ...*Delivery) (context.Context, *turnInfo) {
	t := &turnInfo{addr: addr}
	for _, d := range ds {
		if d.Chain.ID == "" {
			continue
		}
		if t.chain.ID == "" {
			t.chain.ID = d.Chain.ID
		}
		for _, a := range d.Chain.Addresses {
			if !t.chain.Has(a) {
				t.chain.Addresses = append(t.chain.Addresses, a)
			}
		}
	}
	return context.WithValue(ctx, turnKey{}, t), t
}

// turnCtx is a single delivery's turn context: the host's, carrying the
// turn for ChainOf. It lives in the entry, so a turn allocates nothing for
// it.
type turnCtx struct {
	context.Context
	info turnInfo
}

// Value returns the turn for ChainOf, else ctx's value.
func (c *turnCtx) Value(k any) any {
	if _, ok := k.(turnKey); ok {
		return &c.info
	}
	return c.Context.Value(k)
}

// turnContext returns ctx carrying e's turn at addr (see withTurn).
func (e *entry) turnContext(ctx context.Context, addr subjects.Address) (context.Context, *turnInfo) {
	e.tc.Context = ctx
	e.tc.info.addr, e.tc.info.chain = addr, e.Chain
	return &e.tc, &e.tc.info
}

// cycleLocked decides a delivery whose chain names this activation's own
// address: it may run at once beside the waiting turn of its chain (a
// reentrant hub; e.reentrant is set), or it is refused ErrCallCycle.
// Called with a.mu held.
func (a *activation) cycleLocked(e *entry) error {
	if cur := a.current.Load(); a.reentrant && a.state == stateReady && cur != nil && cur.chainID() == e.Chain.ID {
		e.reentrant = true
		return nil
	}
	return verdict.New(verdict.ReasonCallCycle, "%s is already waiting in call chain %s (%s): the request would wait on itself",
		a.addr, e.Chain.ID, e.Chain.String())
}

// runReentrant runs a reentrant delivery at once on its own goroutine.
func (a *activation) runReentrant(e *entry) {
	a.mu.Lock()
	hub := a.hub
	a.mu.Unlock()
	h := a.host
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		a.turn(hub, e)
	}()
}
