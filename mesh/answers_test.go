package mesh

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// TestLateVerdictBeforeKey: a Deliver's genuine late verdict that overtakes
// the acceptance reply carrying its generation's answer key (the first
// delivery a generation accepts; they travel on different subscriptions) is
// held and delivered once the key is learned, not dropped as forged; a
// forgery naming the same generation is still dropped; answers naming a
// generation whose key never comes are bounded and then counted forged.
func TestLateVerdictBeforeKey(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	var mu sync.Mutex
	late := map[string]error{}
	c := newClient(t, natstest.Connect(t, s), StaticResolver{Node: ghost}, WithLateVerdicts(func(v LateVerdict) {
		mu.Lock()
		late[v.ID] = v.Err
		mu.Unlock()
	}))
	// The answer subscription reaches the server before anything is
	// published to it from another connection (a hub's answers follow a
	// leg on the sender's own connection, so the order is NATS's there).
	if err := c.cfg.Conn.Flush(); err != nil {
		t.Fatal(err)
	}
	pub := natstest.Connect(t, s)
	send := func(node subjects.NodeID, key, id string) {
		t.Helper()
		m := nats.NewMsg(c.answerTo())
		m.Header.Set(hub.HeaderID, id)
		m.Header.Set(hub.HeaderAnswer, hub.AnswerVerdict)
		m.Header.Set(hub.HeaderAnswerToken, hub.AnswerTokenOf(key, id))
		verdict.Encode(m.Header, verdict.New(verdict.ReasonActivationFailed, "build failed"), node.String())
		if err := pub.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	received := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(late)
	}
	for round := range 50 {
		node := subjects.NodeID{Name: "n", Generation: uint64(round + 1)}
		key := fmt.Sprintf("key-%d", round)
		id := fmt.Sprintf("d-%d", round)
		send(node, key, id)                   // genuine, before the key
		send(node, "wrong-key", id+"-forged") // a forgery naming the same generation
		if err := pub.Flush(); err != nil {
			t.Fatal(err)
		}
		natstest.Eventually(t, 5*time.Second, func() bool { return c.held.n.Load() >= 2 }, "answers held")
		c.learned(node, []byte(key)) // the acceptance reply arrives
		natstest.Eventually(t, 5*time.Second, func() bool { return received() == round+1 }, "late verdict %s delivered", id)
		natstest.Eventually(t, 5*time.Second, func() bool { return c.Stats().ForgedAnswers == int64(round+1) }, "forgery dropped")
		mu.Lock()
		err := late[id]
		mu.Unlock()
		if !errors.Is(err, verdict.ErrActivationFailed) {
			t.Fatalf("%s: %v", id, err)
		}
	}
	if c.held.n.Load() != 0 {
		t.Fatalf("%d answers still held", c.held.n.Load())
	}
	// A generation whose key never comes: held answers stay bounded.
	forged := c.Stats().ForgedAnswers
	never := subjects.NodeID{Name: "never", Generation: 1}
	for i := range maxHeldAnswers + 40 {
		send(never, "k", fmt.Sprintf("x-%d", i))
	}
	natstest.Eventually(t, 5*time.Second, func() bool { return c.Stats().ForgedAnswers == forged+40 }, "oldest held answers counted forged: %d", c.Stats().ForgedAnswers-forged)
	if n := c.held.n.Load(); n != maxHeldAnswers {
		t.Fatalf("%d held, want the bound %d", n, maxHeldAnswers)
	}
}
