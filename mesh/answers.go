package mesh

import (
	"sync"

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
// (ClientStats.ForgedAnswers).

// maxAnswerKeys bounds the answer keys a client keeps (one per node
// generation that accepted one of its deliveries).
const maxAnswerKeys = 4096

// maxEarlyAnswers bounds the answers a Request holds while its acceptance
// reply is still being processed (an answer may overtake it: they arrive on
// different subscriptions).
const maxEarlyAnswers = 4

// answerKeys maps node generations to their answer keys. Safe for
// concurrent use.
type answerKeys struct {
	mu sync.Mutex
	m  map[subjects.NodeID]string
}

func (k *answerKeys) learn(node subjects.NodeID, reply *nats.Msg) {
	key := reply.Header.Get(hub.HeaderAnswerKey)
	if key == "" {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.m == nil {
		k.m = map[subjects.NodeID]string{}
	}
	if old, ok := k.m[node]; ok && old == key {
		return
	}
	if len(k.m) >= maxAnswerKeys {
		for n := range k.m { // evict an arbitrary generation
			delete(k.m, n)
			break
		}
	}
	k.m[node] = key
}

func (k *answerKeys) get(node subjects.NodeID) string {
	k.mu.Lock()
	defer k.mu.Unlock()
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
