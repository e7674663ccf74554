package mesh_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"os"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/mesh"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// startNATS runs an in-process NATS server (JetStream on, in a temporary
// directory) for an example and returns its URL and a stop function.
func startNATS() (url string, stop func()) {
	dir, err := os.MkdirTemp("", "natsmesh-example-")
	if err != nil {
		log.Fatal(err)
	}
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true, JetStream: true, StoreDir: dir})
	if err != nil {
		log.Fatal(err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		log.Fatal("nats-server did not start")
	}
	return ns.ClientURL(), func() {
		ns.Shutdown()
		ns.WaitForShutdown()
		_ = os.RemoveAll(dir)
	}
}

// greeter is a hub kind: each address gets its own activation, whose
// handler answers requests with a greeting from that address.
func greeter(_ context.Context, addr subjects.Address) (hub.Hub, error) {
	return hub.HandlerFunc(func(_ context.Context, d *hub.Delivery) error {
		return d.Respond([]byte(fmt.Sprintf("hello %s, from %s", d.Payload, addr)))
	}), nil
}

// startGreeterNode connects to url and starts a one-node mesh named name
// that hosts the greeter kind; stop closes the node and its connection.
func startGreeterNode(url, name string) (node *mesh.Node, stop func()) {
	nc, err := nats.Connect(url)
	if err != nil {
		log.Fatal(err)
	}
	node, err = mesh.NewNode(mesh.NodeConfig{Conn: nc, Name: name, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		log.Fatal(err)
	}
	if err := node.Register("greeter", greeter); err != nil {
		log.Fatal(err)
	}
	if err := node.Start(); err != nil {
		log.Fatal(err)
	}
	return node, func() {
		_ = node.Close()
		nc.Close()
	}
}

// Deliver returns once the hub accepted the delivery (it is in the
// activation's inbox); the handler runs later, in order.
func ExampleClient_Deliver() {
	url, stop := startNATS()
	defer stop()
	node, closeNode := startGreeterNode(url, "hello")
	defer closeNode()

	r, err := node.Deliver(context.Background(), mesh.Delivery{To: "greeter/alice", Payload: []byte("bob")})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("accepted by", r.Node.Name, "after", r.Attempts, "attempt")
	// Output: accepted by hello after 1 attempt
}

// Request waits for the handler's response as well.
func ExampleClient_Request() {
	url, stop := startNATS()
	defer stop()
	node, closeNode := startGreeterNode(url, "hello")
	defer closeNode()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := node.Request(ctx, mesh.Delivery{To: "greeter/alice", Payload: []byte("carol")})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(string(resp.Payload))
	// Output: hello carol, from greeter/alice
}

// A hub kind with state: the factory runs once per address, and the
// handler runs one delivery at a time in acceptance order, so the state
// needs no lock. Each address counts on its own.
func ExampleNode_Register() {
	url, stop := startNATS()
	defer stop()
	nc, err := nats.Connect(url)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	node, err := mesh.NewNode(mesh.NodeConfig{Conn: nc, Name: "counters", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		log.Fatal(err)
	}
	err = node.Register("counter", func(_ context.Context, addr subjects.Address) (hub.Hub, error) {
		total := 0 // this activation's state
		return hub.HandlerFunc(func(_ context.Context, d *hub.Delivery) error {
			n, err := strconv.Atoi(string(d.Payload))
			if err != nil {
				return fmt.Errorf("not a number: %q", d.Payload) // the sender gets Failed (handler-error)
			}
			total += n
			return d.Respond([]byte(strconv.Itoa(total)))
		}), nil
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := node.Start(); err != nil {
		log.Fatal(err)
	}
	defer func() { _ = node.Close() }()

	ctx := context.Background()
	for _, d := range []mesh.Delivery{
		{To: "counter/apples", Payload: []byte("3")},
		{To: "counter/apples", Payload: []byte("4")},
		{To: "counter/pears", Payload: []byte("10")},
		{To: "counter/apples", Payload: []byte("x")},
	} {
		resp, err := node.Request(ctx, d)
		if err != nil {
			fmt.Println(d.To, verdict.Classify(err), verdict.ReasonOf(err))
			continue
		}
		fmt.Println(d.To, string(resp.Payload))
	}
	// Output:
	// counter/apples 3
	// counter/apples 7
	// counter/pears 10
	// counter/apples Failed handler-error
}
