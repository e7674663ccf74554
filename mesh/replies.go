package mesh

import (
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// legReplies receives the replies to legs on one wildcard subscription
// (<inbox>.<token>), as nats.go's own request multiplexer does, so that a
// leg can be published in its lane's order and its reply awaited apart
// (lane.go). Safe for concurrent use.
type legReplies struct {
	prefix string // "<inbox>."
	sub    *nats.Subscription

	mu   sync.Mutex
	next uint64
	wait map[uint64]*legWait
}

// legWait is one leg's reply slot.
type legWait struct {
	token   uint64
	subject string
	ch      chan *nats.Msg // buffer 1: the reply, at most once
	timer   *time.Timer    // the leg's timeout: armed by the leg, stopped by forget
}

func (r *legReplies) start(nc *nats.Conn) error {
	r.prefix = nc.NewInbox() + "."
	r.wait = map[uint64]*legWait{}
	sub, err := nc.Subscribe(r.prefix+"*", r.dispatch)
	if err != nil {
		return err
	}
	_ = sub.SetPendingLimits(-1, -1)
	r.sub = sub
	return nil
}

func (r *legReplies) stop() {
	if r.sub != nil {
		_ = r.sub.Unsubscribe()
	}
}

// waitPool recycles reply slots: a slot is handed to dispatch at most once
// (under r.mu), and forget takes back whatever dispatch left in it, so a
// recycled slot never holds a stale reply.
// Its timer is stopped there too (a stopped timer delivers no stale tick
// after Reset, Go 1.23 timer semantics).
var waitPool = sync.Pool{New: func() any {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &legWait{ch: make(chan *nats.Msg, 1), timer: t}
}}

// register returns a fresh reply slot; it must be given back with forget
// (after which it must not be used).
func (r *legReplies) register() *legWait {
	w := waitPool.Get().(*legWait)
	r.mu.Lock()
	r.next++
	w.token = r.next
	r.wait[w.token] = w
	r.mu.Unlock()
	var buf [96]byte
	w.subject = string(strconv.AppendUint(append(buf[:0], r.prefix...), w.token, 36))
	return w
}

// forget removes w: a reply arriving later is dropped.
func (r *legReplies) forget(w *legWait) {
	w.timer.Stop()
	r.mu.Lock()
	if r.wait[w.token] == w {
		delete(r.wait, w.token)
	} else {
		select { // dispatch took it: its reply, if not received, is in ch
		case <-w.ch:
		default:
		}
	}
	r.mu.Unlock()
	w.subject = ""
	waitPool.Put(w)
}

func (r *legReplies) dispatch(m *nats.Msg) {
	if len(m.Subject) <= len(r.prefix) {
		return
	}
	token, err := strconv.ParseUint(m.Subject[len(r.prefix):], 36, 64)
	if err != nil {
		return
	}
	r.mu.Lock()
	if w := r.wait[token]; w != nil {
		delete(r.wait, token)
		w.ch <- m // buffer 1, one reply per slot: never blocks
	}
	r.mu.Unlock()
}
