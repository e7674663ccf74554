// Package counterhub is a durable counter hub (DESIGN §7a) for tests,
// benchmarks and the integration test node: its state is the counter as a
// decimal number. A delivery of type "inc" adds one, saves, and only then
// responds with the new value; "get" (or any other type) responds with the
// value.
//
// With Options.Remember the state also keeps the delivery IDs of the last
// increments, one line each after the counter ("<value> <id>"), so that an
// increment re-sent after an unknown outcome — possibly to a successor
// activation — is answered its value again instead of adding one.
package counterhub

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"

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
	// Remember, if positive, makes increments idempotent by delivery ID:
	// the state keeps the IDs of the last Remember increments with the
	// value each got, and an increment whose ID is among them is answered
	// that value without adding one (nor saving).
	Remember int
}

// Value parses a stored counter state: the counter on its first line (0
// for empty state).
func Value(data []byte) (uint64, error) {
	first, _, _ := bytes.Cut(data, []byte("\n"))
	if len(first) == 0 {
		return 0, nil
	}
	n, err := strconv.ParseUint(string(first), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("counterhub: state %q: %w", first, err)
	}
	return n, nil
}

// Factory returns the counter's factory.
func Factory(o Options) hub.Factory {
	return func(ctx context.Context, addr subjects.Address) (hub.Hub, error) {
		st, err := hub.LoadState(ctx)
		if err != nil {
			return nil, err
		}
		c := &counter{st: st, o: o}
		if err := c.decode(st.Data()); err != nil {
			return nil, err
		}
		if o.Batch {
			return &batchCounter{c}, nil
		}
		return c, nil
	}
}

type applied struct {
	id    string
	value uint64
}

type counter struct {
	st     *hub.State
	o      Options
	n      uint64    // touched only on turns
	recent []applied // the last o.Remember increments, oldest first
}

func (c *counter) decode(b []byte) error {
	n, err := Value(b)
	if err != nil {
		return err
	}
	c.n = n
	_, rest, _ := bytes.Cut(b, []byte("\n"))
	for line := range strings.Lines(string(rest)) {
		v, id, ok := strings.Cut(strings.TrimSuffix(line, "\n"), " ")
		if !ok {
			return fmt.Errorf("counterhub: state line %q", line)
		}
		value, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return fmt.Errorf("counterhub: state line %q: %w", line, err)
		}
		c.recent = append(c.recent, applied{id, value})
	}
	return nil
}

// encode returns the state with n and recent.
func (c *counter) encode(n uint64, recent []applied) []byte {
	b := strconv.AppendUint(nil, n, 10)
	for _, a := range recent {
		b = append(b, '\n')
		b = strconv.AppendUint(b, a.value, 10)
		b = append(b, ' ')
		b = append(b, a.id...)
	}
	return b
}

// seen returns the value an increment with id got, if it is remembered.
func (c *counter) seen(recent []applied, id string) (uint64, bool) {
	if c.o.Remember <= 0 || id == "" {
		return 0, false
	}
	for _, a := range recent {
		if a.id == id {
			return a.value, true
		}
	}
	return 0, false
}

// remember returns recent with id's increment to value appended (bounded).
func (c *counter) remember(recent []applied, id string, value uint64) []applied {
	if c.o.Remember <= 0 || id == "" {
		return recent
	}
	out := append(recent[:len(recent):len(recent)], applied{id, value})
	return out[max(0, len(out)-c.o.Remember):]
}

func (c *counter) Handle(ctx context.Context, d *hub.Delivery) error {
	if d.Type != Inc {
		return d.Respond([]byte(strconv.FormatUint(c.n, 10)))
	}
	if v, ok := c.seen(c.recent, d.ID); ok {
		return d.Respond([]byte(strconv.FormatUint(v, 10)))
	}
	if f := c.o.BeforeSave; f != nil {
		f(d)
	}
	next := c.n + 1
	recent := c.remember(c.recent, d.ID, next)
	err := c.st.Save(ctx, c.encode(next, recent))
	if f := c.o.OnSave; f != nil {
		f(d, next, err)
	}
	if err != nil {
		return err
	}
	c.n, c.recent = next, recent
	return d.Respond([]byte(strconv.FormatUint(next, 10)))
}

type batchCounter struct{ *counter }

// HandleBatch saves the batch's increments at once (hub.Batcher).
func (c *batchCounter) HandleBatch(ctx context.Context, ds []*hub.Delivery) error {
	next, recent := c.n, c.recent
	values := make([]uint64, len(ds))
	for i, d := range ds {
		values[i] = next
		if d.Type != Inc {
			continue
		}
		if v, ok := c.seen(recent, d.ID); ok {
			values[i] = v
			continue
		}
		next++
		values[i] = next
		recent = c.remember(recent, d.ID, next)
	}
	if next != c.n {
		if err := c.st.Save(ctx, c.encode(next, recent)); err != nil {
			return err
		}
	}
	c.n, c.recent = next, recent
	for i, d := range ds {
		_ = d.Respond([]byte(strconv.FormatUint(values[i], 10)))
	}
	return nil
}
