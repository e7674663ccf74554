// Command service embeds a mesh node in a Go service with its own hub kind:
// a counter per address that answers requests with its running total. It
// runs on an embedded NATS server (or joins one given in NATS_URL), with the
// built-in kinds too, until SIGINT or SIGTERM drains it:
//
//	go run ./examples/service
//	go run ./cmd/meshctl request counter/apples 3   # in another shell
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"github.com/natsmesh/natsmesh/daemon"
	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/subjects"
)

// counter is one activation's state: handled one delivery at a time, so it
// needs no lock.
type counter struct{ total int }

func (c *counter) Handle(_ context.Context, d *hub.Delivery) error {
	n, err := strconv.Atoi(string(d.Payload))
	if err != nil {
		return fmt.Errorf("payload %q is not a number", d.Payload)
	}
	c.total += n
	return d.Respond([]byte(strconv.Itoa(c.total)))
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := daemon.Run(ctx, daemon.Config{
		Name:    "service",
		NATSURL: os.Getenv("NATS_URL"), // empty: embedded server on 127.0.0.1:4222
		DataDir: os.TempDir() + "/natsmesh-service",
		HTTP:    "127.0.0.1:7071",
		Kinds: map[string]hub.Factory{
			"counter": func(context.Context, subjects.Address) (hub.Hub, error) { return &counter{}, nil },
		},
		Logger: slog.New(slog.NewTextHandler(os.Stderr, nil)),
		Ready:  func(i daemon.Info) { fmt.Printf("serving %v on %s\n", i.Kinds, i.NATSURL) },
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "service:", err)
		os.Exit(1)
	}
}
