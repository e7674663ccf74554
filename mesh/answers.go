package mesh

import (
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// Answer binding, the sender's half (DESIGN §5; the hub's half and the
// scheme are in hub/answer.go): the client learns each accepting
// generation's answer key from the Accepted reply to its private inbox and
// takes a late verdict or response only with that generation's token for
// the delivery ID. Anything else — a forgery by someone who saw the
// delivery, an answer from another generation — is dropped and counted
// (ClientStats.ForgedAnswers). An answer naming a generation whose key the
// client has not learned yet is held (bounded) until an acceptance from that
// generation teaches it: the first late verdict a generation sends can
// overtake the acceptance reply that carries its key.

// maxAnswerKeys bounds the answer keys a client keeps (one per node
// generation that accepted one of its deliveries).
const maxAnswerKeys = 4096

// maxEarlyAnswers bounds the answers a Request holds while its acceptance
// reply is still being processed (an answer may overtake it: they arrive on
// different subscriptions).
const maxEarlyAnswers = 4

// maxHeldAnswers bounds the answers a client holds because it has not yet
// learned the answer key of the generation they name: a late verdict can
// overtake the acceptance reply that carries the key (they arrive on
// different subscriptions), for the first delivery a generation accepts.
const maxHeldAnswers = 256

// heldAnswers holds answers naming a generation whose answer key is not
// known yet, oldest first, until an acceptance teaches the key (then they
// are dispatched again) or the bound pushes them out (then they count as
// forged). Safe for concurrent use.
type heldAnswers struct {
	mu sync.Mutex
	q  []*nats.Msg
	n  atomic.Int32 // len(q), read without the lock on the hot path
}

// hold keeps m, which names node; the oldest held answer is dropped as
// forged past the bound. An answer naming a generation known gone is
// dropped as forged at once: no acceptance from it can teach its key now.
func (c *Client) hold(m *nats.Msg, node subjects.NodeID) {
	if c.knownGone(node) {
		c.forgedAnswer(m, m.Header.Get(hub.HeaderID))
		return
	}
	h := &c.held
	h.mu.Lock()
	var out *nats.Msg
	if len(h.q) >= maxHeldAnswers {
		out = h.q[0]
		h.q = append(h.q[:0], h.q[1:]...)
	}
	h.q = append(h.q, m)
	h.n.Store(int32(len(h.q)))
	h.mu.Unlock()
	if out != nil {
		c.forgedAnswer(out, out.Header.Get(hub.HeaderID))
	}
}

// learned records node's answer key from an acceptance reply and, if the
// key is new and answers are held, dispatches again (on another goroutine:
// the caller may hold a flight's lock) the held answers that name node.
func (c *Client) learned(node subjects.NodeID, key []byte) {
	if c.keys.learn(node, key) && c.held.n.Load() > 0 {
		go c.release(node)
	}
}

// knownGone reports whether the cluster view knows generation node
// departed.
func (c *Client) knownGone(node subjects.NodeID) bool { return c.opts.view.Gone(node) }

// dropHeld drops the held answers naming departed generation node as
// forged: they cannot be verified any more.
func (c *Client) dropHeld(node subjects.NodeID) {
	if c.held.n.Load() == 0 {
		return
	}
	for _, m := range c.takeHeld(node) {
		c.forgedAnswer(m, m.Header.Get(hub.HeaderID))
	}
}

// release dispatches again the held answers that name node.
func (c *Client) release(node subjects.NodeID) {
	for _, m := range c.takeHeld(node) {
		c.dispatchAnswer(m)
	}
}

// takeHeld removes and returns the held answers that name node.
func (c *Client) takeHeld(node subjects.NodeID) []*nats.Msg {
	h := &c.held
	want := node.String()
	h.mu.Lock()
	var mine []*nats.Msg
	keep := h.q[:0]
	for _, m := range h.q {
		if m.Header.Get(verdict.HeaderNode) == want {
			mine = append(mine, m)
		} else {
			keep = append(keep, m)
		}
	}
	clear(h.q[len(keep):])
	h.q = keep
	h.n.Store(int32(len(h.q)))
	h.mu.Unlock()
	return mine
}

// answerKeys maps node generations to their answer keys. Safe for
// concurrent use.
type answerKeys struct {
	mu sync.RWMutex // read-locked for the common case: the key is known
	m  map[subjects.NodeID]string
}

// learn records node's answer key from an acceptance reply; it reports
// whether the key is new to k.
func (k *answerKeys) learn(node subjects.NodeID, key []byte) bool {
	if len(key) == 0 {
		return false
	}
	k.mu.RLock()
	old, ok := k.m[node]
	k.mu.RUnlock()
	if ok && old == string(key) { // compared, not copied
		return false
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.m == nil {
		k.m = map[subjects.NodeID]string{}
	}
	if old, ok := k.m[node]; ok && old == string(key) { // compared, not copied
		return false
	}
	if len(k.m) >= maxAnswerKeys {
		for n := range k.m { // evict an arbitrary generation
			delete(k.m, n)
			break
		}
	}
	k.m[node] = string(key) // a copy: key may share a reply's payload
	return true
}

func (k *answerKeys) get(node subjects.NodeID) string {
	k.mu.RLock()
	defer k.mu.RUnlock()
	return k.m[node]
}

// genuine reports whether answer m to delivery id carries the token of
// node's answer key.
func (c *Client) genuine(m *nats.Msg, id string, node subjects.NodeID) bool {
	return hub.ValidAnswerToken(c.keys.get(node), id, m.Header.Get(hub.HeaderAnswerToken))
}

// forgedAnswer counts an answer that failed the binding; it logs the first
// and then every power of two, so a flood cannot flood the log.
func (c *Client) forgedAnswer(m *nats.Msg, id string) {
	if n := c.forged.Add(1); n&(n-1) == 0 {
		c.log.Warn("answer ignored: not from the node generation that accepted the delivery (forged or misrouted)",
			"id", id, "claimed_node", m.Header.Get(verdict.HeaderNode), "answer", m.Header.Get(hub.HeaderAnswer), "ignored_total", n)
	}
}

// maxAbandoned bounds the legs a client remembers as abandoned
// (abandonedLegs).
const maxAbandoned = 1 << 16

// abandonedLegs remembers the (delivery ID, generation) pairs of legs this
// client sent and then gave up on without their acceptance — the
// generation departed or its connection moved with the leg in flight, this
// client's link dropped — and answered resendable (the delivery was
// re-sent, perhaps accepted elsewhere). Such a generation may still have
// taken the leg from its socket buffer (a frozen process that wakes), and
// its late verdict or response would carry a genuine token for the ID; but
// the sender takes an answer only from the generation whose acceptance it
// took (DESIGN §5), so an answer for an abandoned pair is dropped
// (ClientStats.StaleAnswers). Bounded: the oldest pairs are forgotten
// first. Safe for concurrent use.
type abandonedLegs struct {
	n    atomic.Int64 // len(set), read without the lock on the hot path
	mu   sync.Mutex
	set  map[abandonedLeg]struct{}
	ring []abandonedLeg
	next int
}

type abandonedLeg struct {
	id   string
	node subjects.NodeID
}

// add remembers that the leg of id sent to node was abandoned.
func (a *abandonedLegs) add(id string, node subjects.NodeID) {
	k := abandonedLeg{id, node}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.set == nil {
		a.set = map[abandonedLeg]struct{}{}
	}
	if _, ok := a.set[k]; ok {
		return
	}
	if len(a.ring) < maxAbandoned {
		a.ring = append(a.ring, k)
	} else {
		delete(a.set, a.ring[a.next])
		a.ring[a.next] = k
		a.next = (a.next + 1) % maxAbandoned
	}
	a.set[k] = struct{}{}
	a.n.Store(int64(len(a.set)))
}

// accepted forgets an abandoned leg of id to node once node accepted id
// (a re-send of the same ID to the same generation): its answers count
// again.
func (a *abandonedLegs) accepted(id string, node subjects.NodeID) {
	k := abandonedLeg{id, node}
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.set, k) // its ring slot stays until overwritten (the ring only bounds the set)
	a.n.Store(int64(len(a.set)))
}

// has reports whether the leg of id to node was abandoned.
func (a *abandonedLegs) has(id string, node subjects.NodeID) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	_, ok := a.set[abandonedLeg{id, node}]
	return ok
}

// staleAnswer counts and logs an answer from a generation whose leg of the
// delivery this client abandoned (abandonedLegs).
func (c *Client) staleAnswer(m *nats.Msg, id string) {
	if n := c.stale.Add(1); n&(n-1) == 0 {
		c.log.Info("answer ignored: its generation's leg was abandoned and the delivery re-sent (DESIGN §5)",
			"id", id, "node", m.Header.Get(verdict.HeaderNode), "answer", m.Header.Get(hub.HeaderAnswer), "ignored_total", n)
	}
}
