// Command testnode is the mesh node the integration tests run as a separate
// OS process where crash semantics matter (SIGKILL, SIGSTOP). It is meshd's
// daemon with three test hub kinds besides echo:
//
//	hold   accepts every delivery and never finishes handling it (requests
//	       await a response that never comes, until the process dies)
//	count  publishes each execution to the subject "test.exec" (headers
//	       Mesh-Id, Test-Node, Test-Address, Test-Stream; the payload is
//	       the delivery's) before it returns, so a test counts executions
//	       and their order across processes
//	slow   like count, after 50 ms of work
//
// Its first stdout line matches meshd's: "meshd: node <id> serving on NATS at <url>".
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/daemon"
	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/subjects"
)

func main() {
	name := flag.String("name", "t", "node name")
	url := flag.String("nats-url", "", "NATS URLs")
	hb := flag.Duration("heartbeat", 250*time.Millisecond, "registry heartbeat")
	ttl := flag.Duration("ttl", time.Second, "registry TTL")
	replicas := flag.Int("kv-replicas", 1, "KV replicas")
	drain := flag.Duration("drain-timeout", 10*time.Second, "drain deadline")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	pub, err := nats.Connect(*url, nats.Name("testnode-exec "+*name), nats.MaxReconnects(-1))
	if err != nil {
		fmt.Fprintln(os.Stderr, "testnode:", err)
		os.Exit(2)
	}
	defer pub.Close()
	counting := func(work time.Duration) hub.Factory {
		return func(context.Context, subjects.Address) (hub.Hub, error) {
			return hub.HandlerFunc(func(ctx context.Context, d *hub.Delivery) error {
				if work > 0 {
					time.Sleep(work)
				}
				m := nats.NewMsg("test.exec")
				m.Header.Set("Mesh-Id", d.ID)
				m.Header.Set("Test-Node", *name)
				m.Header.Set("Test-Address", string(d.To))
				m.Header.Set("Test-Stream", string(d.Stream))
				m.Data = d.Payload
				if err := pub.PublishMsg(m); err != nil {
					return err
				}
				return d.Respond(d.Payload)
			}), nil
		}
	}
	err = daemon.Run(ctx, daemon.Config{
		Name: *name, NATSURL: *url, KVReplicas: *replicas, Heartbeat: *hb, TTL: *ttl, DrainTimeout: *drain,
		Logger: slog.New(slog.NewJSONHandler(os.Stderr, nil)),
		Kinds: map[string]hub.Factory{
			"hold": func(context.Context, subjects.Address) (hub.Hub, error) {
				return hub.HandlerFunc(func(ctx context.Context, d *hub.Delivery) error {
					<-ctx.Done()
					return ctx.Err()
				}), nil
			},
			"count": counting(0),
			"slow":  counting(50 * time.Millisecond),
		},
		Ready: func(i daemon.Info) {
			fmt.Printf("meshd: node %s serving on NATS at %s\n", i.Node, i.NATSURL)
		},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "testnode:", err)
		os.Exit(2)
	}
}
