package syncstream_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"os"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/hubs"
	"github.com/natsmesh/natsmesh/mesh"
	"github.com/natsmesh/natsmesh/syncstream"
)

// Follow the state of a kv hub: the snapshot first, then every change, in
// order. Sync streams need the mesh's membership (JetStream on the NATS
// account): the owner reaches the subscriber's address through the
// directory.
func ExampleSubscribe() {
	dir, _ := os.MkdirTemp("", "natsmesh-example-")
	defer os.RemoveAll(dir)
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true, JetStream: true, StoreDir: dir})
	if err != nil {
		log.Fatal(err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		log.Fatal("nats-server did not start")
	}
	defer ns.Shutdown()

	quiet := slog.New(slog.DiscardHandler)
	node := func(name string, kinds bool) (*mesh.Node, func()) {
		nc, err := nats.Connect(ns.ClientURL())
		if err != nil {
			log.Fatal(err)
		}
		n, err := mesh.NewNode(mesh.NodeConfig{Conn: nc, Name: name, Membership: &mesh.MembershipConfig{}, Logger: quiet})
		if err != nil {
			log.Fatal(err)
		}
		if kinds {
			if err := n.Register(hubs.KVKind, hubs.NewKV(n.Client, quiet)); err != nil {
				log.Fatal(err)
			}
		}
		if err := n.Start(); err != nil {
			log.Fatal(err)
		}
		return n, func() {
			_ = n.Close()
			nc.Close()
		}
	}
	_, closeOwner := node("owner", true) // hosts the kv kind
	defer closeOwner()
	app, closeApp := node("app", false) // hosts nothing; subscribes
	defer closeApp()

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	frames := make(chan syncstream.Frame, 16)
	sub, err := syncstream.Subscribe(ctx, app, "kv/settings", "", func(f syncstream.Frame) { frames <- f })
	if err != nil {
		log.Fatal(err)
	}
	defer sub.Stop()
	if _, err := app.Request(ctx, mesh.Delivery{To: "kv/settings", Type: hubs.KVSet, Payload: []byte("colour=blue")}); err != nil {
		log.Fatal(err)
	}
	for range 2 {
		select {
		case f := <-frames:
			fmt.Printf("snapshot=%v %s\n", f.Snapshot, f.Data)
		case <-sub.Closed():
			log.Fatal(sub.Err())
		case <-ctx.Done():
			log.Fatal("no frame")
		}
	}
	// Output:
	// snapshot=true {}
	// snapshot=false {"key":"colour","value":"blue"}
}
