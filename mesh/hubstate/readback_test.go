package hubstate

import (
	"context"
	"errors"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/subjects"
)

// lostReply is the bucket as a save across a cut link meets it: the
// update is stored (or, with !lands, never arrives), a successor takes
// the record over before anything more is heard, and the reply is lost
// (the save's context ends).
type lostReply struct {
	jetstream.KeyValue
	lands     bool
	successor func()
}

func (l lostReply) Update(ctx context.Context, key string, value []byte, last uint64) (uint64, error) {
	if l.lands {
		if _, err := l.KeyValue.Update(ctx, key, value, last); err != nil {
			return 0, err
		}
	}
	l.successor()
	return 0, context.DeadlineExceeded
}

// TestSaveReadBackAfterTakeover: a save whose reply was lost, read back
// after another activation took the record over, is reported
// hub.ErrStateUnknown — whether or not it landed before the takeover —
// never hub.ErrStateFenced ("nothing written"): the taker may have read
// the save's data and carried it on, so its request must not be answered
// resendable. Before, both read "fenced" (found by the nemesis across a
// cut gateway: a kv-set answered not-the-owner whose value the successor
// then served).
func TestSaveReadBackAfterTakeover(t *testing.T) {
	s := natstest.RunServer(t)
	ctx := context.Background()
	a := subjects.NodeID{Name: "a", Generation: 1}
	b := subjects.NodeID{Name: "b", Generation: 2}
	for _, lands := range []bool{true, false} {
		st, err := Open(ctx, Config{Conn: natstest.Connect(t, s)})
		if err != nil {
			t.Fatal(err)
		}
		other, err := Open(ctx, Config{Conn: natstest.Connect(t, s)})
		if err != nil {
			t.Fatal(err)
		}
		addr := subjects.Address("kv/lost-reply-" + map[bool]string{true: "landed", false: "unsent"}[lands])
		prev, err := st.Take(ctx, addr, a)
		if err != nil {
			t.Fatal(err)
		}
		var taken hub.StateRecord
		st.kv = lostReply{KeyValue: st.kv, lands: lands, successor: func() {
			if taken, err = other.Take(ctx, addr, b); err != nil {
				t.Error(err)
			}
		}}
		_, serr := st.Save(ctx, addr, prev, []byte("x"))
		if !errors.Is(serr, hub.ErrStateUnknown) || errors.Is(serr, hub.ErrStateFenced) {
			t.Errorf("landed=%v: save %v, want only hub.ErrStateUnknown", lands, serr)
		}
		if got := string(taken.Data); lands != (got == "x") {
			t.Errorf("landed=%v: the successor took over %q", lands, got)
		}
	}
}
