// Package counterhub is a durable counter hub (DESIGN §7a) for tests,
// benchmarks and the integration test node: its state is the counter as a
// decimal number. A delivery of type "inc" adds one, saves, and only then
// responds with the new value; "reset" deletes the stored state (the
// counter is 0 again); "get" (or any other type) responds with the value.
//
// With Options.Remember the state also keeps the delivery IDs of the last
// increments of each stream, one line each after the counter ("<value> <id>
// <stream>"), so that an increment re-sent after an unknown outcome —
// possibly to a successor activation — is answered its value again instead
// of adding one. A sender that re-sends each increment until it is
// answered before it sends the next on its stream needs 1; the bound is
// per stream so that other senders' traffic, however fast, cannot push a
// sender's unanswered increment out.
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
	Inc   = "inc"
	Get   = "get"
	Reset = "reset" // deletes the stored state (hub.State.Delete); responds "0" (not in Batch mode)
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
	// the state keeps the IDs of the last Remember increments of each
	// stream (of the last MaxStreams streams) with the value each got, and
	// an increment whose ID is among them is answered that value without
	// adding one (nor saving).
	Remember int
}

// MaxStreams bounds the streams whose increments a remembering counter
// keeps: past it, the stream that incremented least recently is forgotten.
const MaxStreams = 64

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
	id, stream string
	value      uint64
}

type counter struct {
	st     *hub.State
	o      Options
	n      uint64    // touched only on turns
	recent []applied // the remembered increments, oldest first
}

func (c *counter) decode(b []byte) error {
	n, err := Value(b)
	if err != nil {
		return err
	}
	c.n = n
	_, rest, _ := bytes.Cut(b, []byte("\n"))
	for line := range strings.Lines(string(rest)) {
		v, rest, ok := strings.Cut(strings.TrimSuffix(line, "\n"), " ")
		id, stream, ok2 := strings.Cut(rest, " ")
		if !ok || !ok2 {
			return fmt.Errorf("counterhub: state line %q", line)
		}
		value, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return fmt.Errorf("counterhub: state line %q: %w", line, err)
		}
		c.recent = append(c.recent, applied{id: id, stream: stream, value: value})
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
		b = append(b, ' ')
		b = append(b, a.stream...)
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

// remember returns a copy of recent (oldest first) with d's increment to
// value appended, keeping the last Remember of each stream and the last
// MaxStreams streams.
func (c *counter) remember(recent []applied, d *hub.Delivery, value uint64) []applied {
	if c.o.Remember <= 0 || d.ID == "" {
		return recent
	}
	stream := string(d.Stream)
	all := append(recent[:len(recent):len(recent)], applied{id: d.ID, stream: stream, value: value})
	// Keep, newest first, Remember entries per stream of the MaxStreams
	// most recent streams.
	per := map[string]int{}
	keep := make([]bool, len(all))
	for i := len(all) - 1; i >= 0; i-- {
		s := all[i].stream
		if _, seen := per[s]; !seen && len(per) == MaxStreams {
			continue
		}
		if per[s] < c.o.Remember {
			per[s]++
			keep[i] = true
		}
	}
	out := all[:0:0]
	for i, a := range all {
		if keep[i] {
			out = append(out, a)
		}
	}
	return out
}

func (c *counter) Handle(ctx context.Context, d *hub.Delivery) error {
	if d.Type == Reset {
		if err := c.st.Delete(ctx); err != nil {
			return err
		}
		c.n, c.recent = 0, nil
		return d.Respond([]byte("0"))
	}
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
	recent := c.remember(c.recent, d, next)
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
		recent = c.remember(recent, d, next)
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
