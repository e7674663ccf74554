package mesh

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
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

// BenchmarkIngressConcurrent256: 256 outside workers on 16 connections,
// each connection its own caller (inbox prefix "_INBOX.bench<k>": dedupe,
// kept answers and the fair ingress shares are per caller), each worker
// its own stream (lane), 128-byte payload, against raw NATS request/reply
// with 256 workers in the same run.
func BenchmarkIngressConcurrent256(b *testing.B) {
	s := natstest.RunServer(b)
	const workers, callers = 256, 16
	b.Run("ingress", func(b *testing.B) {
		benchNode(b, s)
		conns := make([]*nats.Conn, callers)
		for i := range conns {
			conns[i] = natstest.Connect(b, s, nats.CustomInboxPrefix(fmt.Sprintf("_INBOX.bench%d", i)))
		}
		subjs := make([]string, workers)
		for i := range subjs {
			subjs[i] = subjects.DefaultPrefix.Ingress("bench/ingress", subjects.Stream(fmt.Sprint(i)))
		}
		if _, err := conns[0].Request(subjs[0], payload128, 5*time.Second); err != nil { // warm: activation built
			b.Fatal(err)
		}
		b.ReportAllocs()
		runWorkers(b, workers, func(w int) error {
			r, err := conns[w%callers].Request(subjs[w], payload128, 5*time.Second)
			if err != nil {
				return err
			}
			_, err = verdict.Decode(r.Header)
			return err
		})
	})
	b.Run("raw", func(b *testing.B) {
		rawResponder(b, s, "raw.ingress256")
		nc := natstest.Connect(b, s)
		b.ReportAllocs()
		runWorkers(b, workers, func(int) error {
			_, err := nc.Request("raw.ingress256", payload128, 5*time.Second)
			return err
		})
	})
}
