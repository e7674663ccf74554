package mesh_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/mesh"
	"github.com/natsmesh/natsmesh/mesh/reminders"
	"github.com/natsmesh/natsmesh/subjects"
)

// A hub kind that sets itself a durable reminder in its turn and is woken
// by it: the fire is a delivery of the reminder's type, carrying its name
// and due time, that activates the address again if it was collected.
func ExampleNode_Reminders() {
	url, stopNATS := startNATS()
	defer stopNATS()
	nc, err := nats.Connect(url)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	node, err := mesh.NewNode(mesh.NodeConfig{Conn: nc, Name: "n1", Logger: slog.New(slog.DiscardHandler),
		Membership: &mesh.MembershipConfig{}})
	if err != nil {
		log.Fatal(err)
	}
	woken := make(chan *hub.Delivery, 1)
	err = node.Register("alarm", func(_ context.Context, addr subjects.Address) (hub.Hub, error) {
		return hub.HandlerFunc(func(ctx context.Context, d *hub.Delivery) error {
			if d.Reminder != "" { // a fire
				woken <- d
				return nil
			}
			// Any other delivery arms the alarm: a one-shot 200 ms from now.
			_, err := node.Reminders().Set(ctx, reminders.Reminder{
				Address: addr, Name: "wake-up", Schedule: reminders.In(200 * time.Millisecond), Type: "ring",
			})
			return err
		}), nil
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := node.Start(); err != nil {
		log.Fatal(err)
	}
	defer node.Close()

	if _, err := node.Request(context.Background(), mesh.Delivery{To: "alarm/kitchen", Type: "arm"}); err != nil {
		log.Fatal(err)
	}
	select {
	case d := <-woken:
		fmt.Printf("%s woken by reminder %q (type %s); handled within 5 s of its due time: %v\n", d.To, d.Reminder, d.Type, time.Since(d.Due) < 5*time.Second)
	case <-time.After(10 * time.Second):
		fmt.Println("no fire")
	}
	// Output:
	// alarm/kitchen woken by reminder "wake-up" (type ring); handled within 5 s of its due time: true
}
