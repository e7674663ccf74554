package mesh

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/subjects"
)

// BenchmarkIngressSequential: one outside client, one ingress delivery at a
// time (the ingress node forwards to itself, generates the delivery ID and
// keys dedupe on the caller), 128-byte payload, against raw NATS
// request/reply in the same run.
func BenchmarkIngressSequential(b *testing.B) {
	s := natstest.RunServer(b)
	b.Run("ingress", func(b *testing.B) {
		benchNode(b, s)
		nc := natstest.Connect(b, s, nats.CustomInboxPrefix("_INBOX.bench"))
		subj := subjects.DefaultPrefix.Ingress("bench/ingress", "")
		if _, err := nc.Request(subj, payload128, 5*time.Second); err != nil { // warm: activation built
			b.Fatal(err)
		}
		runSequential(b, func() error {
			_, err := nc.Request(subj, payload128, 5*time.Second)
			return err
		})
	})
	b.Run("raw", func(b *testing.B) {
		rawResponder(b, s, "raw.ingress")
		nc := natstest.Connect(b, s)
		runSequential(b, func() error {
			_, err := nc.Request("raw.ingress", payload128, 5*time.Second)
			return err
		})
	})
}
