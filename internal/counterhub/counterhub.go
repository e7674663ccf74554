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
	// Batch makes the hub a hub.Batcher: the increments of the deliveries
	// queued together are saved with one save, then each is answered with
	// its own value. BeforeSave and OnSave are not called for batches.
	Batch bool
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
		if o.Batch {
			return &batchCounter{c}, nil
		}
		return c, nil
	}
}

type batchCounter struct{ *counter }

// HandleBatch saves the batch's increments at once (hub.Batcher).
func (c *batchCounter) HandleBatch(ctx context.Context, ds []*hub.Delivery) error {
	next := c.n
	for _, d := range ds {
		if d.Type == Inc {
			next++
		}
	}
	if next != c.n {
		if err := c.st.Save(ctx, []byte(strconv.FormatUint(next, 10))); err != nil {
			return err
		}
	}
	for _, d := range ds {
		if d.Type == Inc {
			c.n++
		}
		_ = d.Respond([]byte(strconv.FormatUint(c.n, 10)))
	}
	return nil
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
