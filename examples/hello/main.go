// Command hello hosts a hub and delivers to it: the smallest complete use of
// natsmesh. It starts its own in-process NATS server; run it with
//
//	go run ./examples/hello
package main

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/mesh"
	"github.com/natsmesh/natsmesh/subjects"
)

func main() {
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1})
	if err != nil {
		log.Fatal(err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(5 * time.Second) {
		log.Fatal("nats-server did not start")
	}
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		log.Fatal(err)
	}
	node, err := mesh.NewNode(mesh.NodeConfig{Conn: nc, Name: "hello"})
	if err != nil {
		log.Fatal(err)
	}
	// A hub kind: one activation per address, one delivery at a time.
	node.Register("greeter", func(ctx context.Context, addr subjects.Address) (hub.Hub, error) {
		return hub.HandlerFunc(func(ctx context.Context, d *hub.Delivery) error {
			return d.Respond([]byte(fmt.Sprintf("hello %s, from %s", d.Payload, addr)))
		}), nil
	})
	if err := node.Start(); err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	r, err := node.Deliver(ctx, mesh.Delivery{To: "greeter/alice", Payload: []byte("bob")})
	fmt.Println("Deliver:", r.Node, r.Attempts, err) // accepted, handled later
	resp, err := node.Request(ctx, mesh.Delivery{To: "greeter/alice", Payload: []byte("carol")})
	fmt.Println("Request:", string(resp.Payload), err)
	_ = node.Drain(ctx)
	nc.Close()
	ns.Shutdown()
}
