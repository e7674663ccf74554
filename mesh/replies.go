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
	free []*legWait // answered slots, reused with their token and subject
}

// legWait is one leg's reply slot. Its token and subject are its own for
// its whole life: a slot is reused only once the one reply its leg can get
// has come (forget), so no reply meant for an earlier leg can reach a later
// one; a slot whose leg ended without its reply (a timeout, an event, the
// caller's cancellation) is dropped with its subject.
type legWait struct {
	token   uint64
	subject string
	ch      chan *nats.Msg // buffer 1: the reply, at most once
	timer   *time.Timer    // the leg's timeout: armed by the leg, stopped by forget
}

// maxFreeSlots bounds the answered reply slots a client keeps for reuse.
const maxFreeSlots = 1024

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

// register returns a reply slot; it must be given back with forget (after
// which it must not be used).
func (r *legReplies) register() *legWait {
	r.mu.Lock()
	if n := len(r.free); n > 0 {
		w := r.free[n-1]
		r.free[n-1] = nil
		r.free = r.free[:n-1]
		r.wait[w.token] = w
		r.mu.Unlock()
		return w
	}
	r.next++
	token := r.next
	r.mu.Unlock()
	t := time.NewTimer(time.Hour) // real clock: a leg's timeout bounds a NATS request
	t.Stop()
	var buf [96]byte
	w := &legWait{token: token, ch: make(chan *nats.Msg, 1), timer: t,
		subject: string(strconv.AppendUint(append(buf[:0], r.prefix...), token, 36))}
	r.mu.Lock()
	r.wait[token] = w
	r.mu.Unlock()
	return w
}

// forget removes w: a reply arriving later is dropped. Its timer is stopped
// (a stopped timer delivers no stale tick after Reset, Go 1.23 timer
// semantics). If its reply came (dispatch took it), the slot is kept for
// reuse, drained of a reply its leg did not read; otherwise it is dropped:
// the reply may still come.
func (r *legReplies) forget(w *legWait) {
	w.timer.Stop()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.wait[w.token] == w {
		delete(r.wait, w.token)
		return // unanswered: never reused
	}
	select { // dispatch took it: its reply, if not received, is in ch
	case <-w.ch:
	default:
	}
	if len(r.free) < maxFreeSlots {
		r.free = append(r.free, w)
	}
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
