// Package counterhub is a durable counter hub (DESIGN §7a) for tests,
// benchmarks and the integration test node: its state is the counter as a
// decimal number. A delivery of type "inc" adds one, saves, and only then
// responds with the new value; "get" (or any other type) responds with the
// value.
package counterhub

import (
	"context"
	"strconv"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/subjects"
)

// Delivery types.
const (
	Inc = "inc"
	Get = "get"
)

// Options tune the factory.
type Options struct {
	// BeforeSave, if set, runs on the turn before each save (tests use it
	// to hold a turn between its change and its save).
	BeforeSave func(d *hub.Delivery)
	// OnSave, if set, runs after each save with its outcome.
	OnSave func(d *hub.Delivery, value uint64, err error)
}

// Factory returns the counter's factory.
func Factory(o Options) hub.Factory {
	return func(ctx context.Context, addr subjects.Address) (hub.Hub, error) {
		st, err := hub.LoadState(ctx)
		if err != nil {
			return nil, err
		}
		c := &counter{st: st, o: o}
		if b := st.Data(); len(b) > 0 {
			if c.n, err = strconv.ParseUint(string(b), 10, 64); err != nil {
				return nil, err
			}
		}
		return c, nil
	}
}

type counter struct {
	st *hub.State
	o  Options
	n  uint64 // touched only on turns
}

func (c *counter) Handle(ctx context.Context, d *hub.Delivery) error {
	if d.Type != Inc {
		return d.Respond([]byte(strconv.FormatUint(c.n, 10)))
	}
	if f := c.o.BeforeSave; f != nil {
		f(d)
	}
	next := c.n + 1
	err := c.st.Save(ctx, []byte(strconv.FormatUint(next, 10)))
	if f := c.o.OnSave; f != nil {
		f(d, next, err)
	}
	if err != nil {
		return err
	}
	c.n = next
	return d.Respond([]byte(strconv.FormatUint(next, 10)))
}
