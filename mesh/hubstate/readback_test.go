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

// TestSaveRevisionMismatch: a save refused with a revision mismatch is
// fenced ("nothing written") only when the record moved on without it.
// A mismatch whose record is this save (a repeated publish whose first
// copy landed) is the save's success; one whose successor holds this
// save's data is outcome unknown. Before, every mismatch read "fenced"
// (found by TestLeaseServerPartition: a kv-set answered not-the-owner —
// resendable — whose value the next get served).
func TestSaveRevisionMismatch(t *testing.T) {
	s := natstest.RunServer(t)
	ctx := context.Background()
	a := subjects.NodeID{Name: "a", Generation: 1}
	b := subjects.NodeID{Name: "b", Generation: 2}
	open := func() *Store {
		st, err := Open(ctx, Config{Conn: natstest.Connect(t, s)})
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	st, other := open(), open()

	t.Run("repeat of a save that landed", func(t *testing.T) {
		addr := subjects.Address("kv/repeat")
		prev, err := st.Take(ctx, addr, a)
		if err != nil {
			t.Fatal(err)
		}
		rs := *st
		rs.kv = repeated{KeyValue: st.kv}
		got, err := rs.Save(ctx, addr, prev, []byte("x"))
		if err != nil {
			t.Fatalf("save: %v, want the landed record", err)
		}
		cur, err := st.Get(ctx, addr)
		if err != nil || got.Revision != cur.Revision || string(cur.Data) != "x" || cur.Epoch != prev.Epoch {
			t.Fatalf("save returned %+v, the record is %+v (%v)", got, cur, err)
		}
		if _, err := st.Save(ctx, addr, got, []byte("y")); err != nil {
			t.Fatalf("the next save on the returned record: %v", err)
		}
	})
	t.Run("taken over before the save", func(t *testing.T) {
		addr := subjects.Address("kv/fenced")
		prev, err := st.Take(ctx, addr, a)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := other.Take(ctx, addr, b); err != nil {
			t.Fatal(err)
		}
		_, err = st.Save(ctx, addr, prev, []byte("x"))
		if !errors.Is(err, hub.ErrStateFenced) || errors.Is(err, hub.ErrStateUnknown) {
			t.Fatalf("save: %v, want only hub.ErrStateFenced", err)
		}
	})
	t.Run("successor holds this save's data", func(t *testing.T) {
		addr := subjects.Address("kv/carried")
		prev, err := st.Take(ctx, addr, a)
		if err != nil {
			t.Fatal(err)
		}
		rs := *st
		rs.kv = repeated{KeyValue: st.kv, successor: func() {
			if _, err := other.Take(ctx, addr, b); err != nil {
				t.Error(err)
			}
		}}
		_, err = rs.Save(ctx, addr, prev, []byte("x"))
		if !errors.Is(err, hub.ErrStateUnknown) || errors.Is(err, hub.ErrStateFenced) {
			t.Fatalf("save: %v, want only hub.ErrStateUnknown", err)
		}
	})
}

// repeated is the bucket as a save meets it when its publish is repeated:
// the first is stored, then (if successor is set) a successor takes the
// record over, carrying the update's data on; the reply the caller hears
// is the repeat's, "wrong last sequence", because the first moved the
// revision on.
type repeated struct {
	jetstream.KeyValue
	successor func()
}

func (r repeated) Update(ctx context.Context, key string, value []byte, last uint64) (uint64, error) {
	if _, err := r.KeyValue.Update(ctx, key, value, last); err != nil {
		return 0, err
	}
	if r.successor != nil {
		r.successor()
	}
	return r.KeyValue.Update(ctx, key, value, last)
}

// TestSaveMismatchAfterSuccessorSaved: a stale save refused because a
// successor took over and saved its own data is fenced — nothing of it
// was written. (The case Save cannot tell from this one, a successor that
// carried the save on and saved again before the read-back, is the
// documented residual of protocol.md §8b.)
func TestSaveMismatchAfterSuccessorSaved(t *testing.T) {
	s := natstest.RunServer(t)
	ctx := context.Background()
	st, err := Open(ctx, Config{Conn: natstest.Connect(t, s)})
	if err != nil {
		t.Fatal(err)
	}
	addr := subjects.Address("kv/successor-saved")
	prev, err := st.Take(ctx, addr, subjects.NodeID{Name: "a", Generation: 1})
	if err != nil {
		t.Fatal(err)
	}
	taken, err := st.Take(ctx, addr, subjects.NodeID{Name: "b", Generation: 2})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Save(ctx, addr, taken, []byte("b's")); err != nil {
		t.Fatal(err)
	}
	_, err = st.Save(ctx, addr, prev, []byte("a's"))
	if !errors.Is(err, hub.ErrStateFenced) || errors.Is(err, hub.ErrStateUnknown) {
		t.Fatalf("stale save: %v, want only hub.ErrStateFenced", err)
	}
}
