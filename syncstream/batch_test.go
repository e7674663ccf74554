package syncstream_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/mesh"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/syncstream"
	"github.com/natsmesh/natsmesh/verdict"
)

// startPublisher registers kind "pub" on n: its hubs are bare stream owners
// (empty snapshot); the returned function gives an address's owner once it
// is activated.
func startPublisher(t testing.TB, n *mesh.Node) func(subjects.Address) *syncstream.Owner {
	var owners sync.Map // subjects.Address -> *syncstream.Owner
	if err := n.Register("pub", func(_ context.Context, addr subjects.Address) (hub.Hub, error) {
		o := syncstream.NewOwner(n.Client, addr, func(subjects.Stream) []byte { return nil }, quiet)
		owners.Store(addr, o)
		return hub.HandlerFunc(func(_ context.Context, d *hub.Delivery) error {
			_, err := o.Handle(d)
			return err
		}), nil
	}); err != nil {
		t.Fatal(err)
	}
	return func(addr subjects.Address) *syncstream.Owner {
		var o any
		natstest.Eventually(t, 5*time.Second, func() bool { o, _ = owners.Load(addr); return o != nil }, "owner of %s activated", addr)
		return o.(*syncstream.Owner)
	}
}

// payloadOf is frame payload number i of publisher g: its first 12 bytes
// say (g, i), the rest repeats g+i.
func payloadOf(g, i, size int) []byte {
	p := make([]byte, size)
	binary.BigEndian.PutUint32(p, uint32(g))
	binary.BigEndian.PutUint64(p[4:], uint64(i))
	for j := 12; j < size; j++ {
		p[j] = byte(g + i)
	}
	return p
}

func checkPayload(p []byte) error {
	if len(p) < 12 {
		return fmt.Errorf("payload of %d bytes", len(p))
	}
	g, i := int(binary.BigEndian.Uint32(p)), int(binary.BigEndian.Uint64(p[4:]))
	for j := 12; j < len(p); j++ {
		if p[j] != byte(g+i) {
			return fmt.Errorf("payload (%d, %d) corrupt at %d", g, i, j)
		}
	}
	return nil
}

// TestBurstAppliedInOrder: frames published faster than the round trip,
// from several goroutines at once, leave several to a delivery and are
// applied every one, in version order, none stale, each intact — with a
// server max_payload small enough that batches are cut (and a frame larger
// than a batch's bound travels alone), over many repetitions.
func TestBurstAppliedInOrder(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t, natstest.WithMaxPayload(8192)) // batches of at most 4 KiB
	owner, _ := startNode(t, s, "owner", false)
	owned := startPublisher(t, owner)
	sub, _ := startNode(t, s, "sub", false)
	wire := capture(t, s, sub.ID())
	const publishers, each = 4, 400
	for round := 0; round < 3; round++ {
		var mu sync.Mutex
		var got []syncstream.Frame
		var bad []error
		addr := subjects.Address(fmt.Sprintf("pub/b%d", round))
		ss, err := syncstream.Subscribe(context.Background(), sub, addr, "", func(f syncstream.Frame) {
			mu.Lock()
			defer mu.Unlock()
			if n := len(got); n > 0 && f.Version != got[n-1].Version+1 {
				bad = append(bad, fmt.Errorf("version %d after %d", f.Version, got[n-1].Version))
			}
			if n := len(got); n > 0 {
				if err := checkPayload(f.Data); err != nil {
					bad = append(bad, err)
				}
			}
			got = append(got, f)
		})
		if err != nil {
			t.Fatal(err)
		}
		o := owned(addr)
		var wg sync.WaitGroup
		for g := 0; g < publishers; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < each; i++ {
					size := 100 + (i*37)%900
					if i == each/2 {
						size = 6000 // over the 4 KiB bound
					}
					o.Publish("", payloadOf(g, i, size))
				}
			}()
		}
		wg.Wait()
		natstest.Eventually(t, 20*time.Second, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(got) == 1+publishers*each
		}, "round %d: every frame applied", round)
		applied, stale, _ := ss.Stats()
		mu.Lock()
		if !got[0].Snapshot || got[len(got)-1].Version != publishers*each || applied != int64(len(got)) || stale != 0 {
			t.Errorf("round %d: %d frames, last version %d, applied %d, stale %d", round, len(got), got[len(got)-1].Version, applied, stale)
		}
		for _, err := range bad {
			t.Errorf("round %d: %v", round, err)
		}
		mu.Unlock()
		ss.Stop()
		natstest.Eventually(t, 5*time.Second, func() bool { return o.Subscribers("") == 0 }, "unsubscribed")
	}
	deliveries, batched := 0, 0
	for _, m := range wire() {
		fs := framesOf(t, m)
		deliveries++
		if len(fs) > 1 {
			batched++
			if len(m.Data) > 4096 {
				t.Errorf("a delivery of %d frames carries %d bytes (bound 4096)", len(fs), len(m.Data))
			}
		}
		if m.Header.Get("Mesh-Type") != syncstream.TypeFrames {
			t.Errorf("a Go subscriber got %s", m.Header.Get("Mesh-Type"))
		}
	}
	t.Logf("%d frames in %d deliveries (%d of several frames)", 3*(1+publishers*each), deliveries, batched)
}

// TestLegacySubscriberGetsJSONFrames: a subscriber that does not ask for
// the frames encoding (an older one, or another language's that reads only
// JSON) gets one JSON natsmesh.frame per delivery, in order; one that asks
// for format 1 gets natsmesh.frames.
func TestLegacySubscriberGetsJSONFrames(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	owner, _ := startNode(t, s, "owner", false)
	owned := startPublisher(t, owner)
	sub, _ := startNode(t, s, "sub", false)
	type got struct {
		typ    string
		frames []syncstream.Frame
	}
	var mu sync.Mutex
	received := map[subjects.Address][]got{}
	if err := sub.Register("legacy", func(_ context.Context, addr subjects.Address) (hub.Hub, error) {
		return hub.HandlerFunc(func(_ context.Context, d *hub.Delivery) error {
			g := got{typ: d.Type}
			switch d.Type {
			case syncstream.TypeFrame:
				var f syncstream.Frame
				if err := json.Unmarshal(d.Payload, &f); err != nil {
					t.Errorf("JSON frame: %v", err)
				}
				g.frames = []syncstream.Frame{f}
			case syncstream.TypeFrames:
				fs, err := syncstream.DecodeFrames(d.Payload)
				if err != nil {
					t.Errorf("frames: %v", err)
				}
				g.frames = fs
			}
			mu.Lock()
			received[addr] = append(received[addr], g)
			mu.Unlock()
			return nil
		}), nil
	}); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 5*time.Second, func() bool { return len(owner.Members().Hosting("legacy")) == 1 }, "legacy kind visible")
	for _, c := range []struct {
		sub, attempt string
		format       string // the request's format field, if any
		want         string
	}{
		{"old", "A1", "", syncstream.TypeFrame},
		{"new", "A2", `, "format": 1`, syncstream.TypeFrames},
		{"future", "A3", `, "format": 7`, syncstream.TypeFrames}, // a later format: the owner writes the one it has
	} {
		c.sub = "legacy/" + c.sub
		request := `{"subscriber": "` + c.sub + `", "stream": "", "attempt": "` + c.attempt + `"` + c.format + `}`
		addr := subjects.Address("pub/of-" + c.sub[len("legacy/"):])
		if _, err := sub.Request(context.Background(), mesh.Delivery{To: addr, Type: syncstream.TypeSubscribe, Payload: []byte(request)}); err != nil {
			t.Fatalf("%s: subscribe: %v", c.sub, err)
		}
		o := owned(addr)
		for i := 0; i < 200; i++ {
			o.Publish("", []byte{byte(i)})
		}
		var frames []syncstream.Frame
		natstest.Eventually(t, 10*time.Second, func() bool {
			mu.Lock()
			defer mu.Unlock()
			frames = frames[:0]
			for _, g := range received[subjects.Address(c.sub)] {
				if g.typ != c.want {
					t.Fatalf("%s got a %s delivery, want %s", c.sub, g.typ, c.want)
				}
				if g.typ == syncstream.TypeFrame && len(g.frames) != 1 {
					t.Fatalf("%s: a JSON delivery of %d frames", c.sub, len(g.frames))
				}
				frames = append(frames, g.frames...)
			}
			return len(frames) == 201
		}, "%s: snapshot and 200 frames", c.sub)
		if !frames[0].Snapshot || frames[0].Attempt != c.attempt || frames[0].Version != 0 {
			t.Errorf("%s: first frame %+v", c.sub, frames[0])
		}
		for i, f := range frames[1:] {
			if f.Version != uint64(i+1) || len(f.Data) != 1 || f.Data[0] != byte(i) {
				t.Fatalf("%s: frame %d is %+v", c.sub, i+1, f)
			}
		}
	}
}

// TestMalformedFramesRefused: a frames delivery that does not decode — even
// one whose first frame is valid and new — is refused with bad-request and
// nothing of it is applied; a JSON natsmesh.frame is still applied.
func TestMalformedFramesRefused(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	owner, _ := startNode(t, s, "owner", false)
	owned := startPublisher(t, owner)
	sub, _ := startNode(t, s, "sub", false)
	wire := capture(t, s, sub.ID())
	var applied []syncstream.Frame
	var mu sync.Mutex
	ss, err := syncstream.Subscribe(context.Background(), sub, "pub/m", "", func(f syncstream.Frame) {
		mu.Lock()
		applied = append(applied, f)
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Stop()
	_ = owned("pub/m")
	natstest.Eventually(t, 5*time.Second, func() bool { return len(wire()) == 1 }, "snapshot captured")
	natstest.Eventually(t, 5*time.Second, func() bool { a, _, _ := ss.Stats(); return a == 1 }, "snapshot applied")
	subject := wire()[0].Subject
	epoch, version := ss.Position()
	next := syncstream.Frame{Epoch: epoch, Version: version + 1, Data: []byte("next")}
	raw := natstest.Connect(t, s)
	answerTo := subjects.DefaultPrefix.Sub("ans.malformed.1")
	answers, err := raw.SubscribeSync(answerTo)
	if err != nil {
		t.Fatal(err)
	}
	// send delivers p as a request (so the handler's error comes back as
	// the answer, not only logged) and returns its verdict: the reply's,
	// or if that is Accepted, the answer's.
	send := func(typ string, p []byte) error {
		t.Helper()
		id := nuidFor(t)
		m := nats.NewMsg(subject)
		m.Header.Set("Mesh-Id", id)
		m.Header.Set("Mesh-Type", typ)
		m.Header.Set("Mesh-Answer-To", answerTo)
		m.Header.Set("Mesh-Expect-Response", "true")
		m.Data = p
		r, err := raw.RequestMsg(m, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if _, err = verdict.Decode(r.Header); err != nil {
			return err
		}
		a, err := answers.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatalf("no answer: %v", err)
		}
		if a.Header.Get("Mesh-Id") != id {
			t.Fatalf("late verdict for %s, want %s", a.Header.Get("Mesh-Id"), id)
		}
		_, err = verdict.Decode(a.Header) // a response carries the handler's verdict
		return err
	}
	good := syncstream.AppendFrames(nil, next)
	for name, p := range map[string][]byte{
		"truncated second frame": append(append([]byte(nil), good...), good[1:len(good)-2]...),
		"unknown format":         append([]byte{9}, good[1:]...),
		"unknown flags":          append(append([]byte(nil), good...), 0x80, 0, 0, 0, 0),
		"empty":                  {},
		"JSON as frames":         []byte(`{"epoch":1}`),
	} {
		if err := send(syncstream.TypeFrames, p); verdict.ReasonOf(err) != verdict.ReasonBadRequest {
			t.Errorf("%s: verdict %v, want bad-request", name, err)
		}
	}
	if err := send("natsmesh.other", good); verdict.ReasonOf(err) != verdict.ReasonBadRequest {
		t.Errorf("another type: verdict %v, want bad-request", err)
	}
	if err := send(syncstream.TypeFrame, []byte("{")); verdict.ReasonOf(err) != verdict.ReasonBadRequest {
		t.Errorf("malformed JSON frame: verdict %v, want bad-request", err)
	}
	if e, v := ss.Position(); e != epoch || v != version { // their turns ended before their late verdicts
		t.Fatalf("a refused delivery moved the mirror to (%d, %d)", e, v)
	}
	if a, st, _ := ss.Stats(); a != 1 || st != 0 {
		t.Fatalf("applied %d stale %d after refused deliveries; want 1, 0", a, st)
	}
	js, _ := json.Marshal(syncstream.Frame{Epoch: epoch, Version: version + 2, Data: []byte("json")})
	replay(t, raw, []*nats.Msg{
		{Subject: subject, Header: nats.Header{"Mesh-Type": {syncstream.TypeFrames}}, Data: good},
		{Subject: subject, Header: nats.Header{"Mesh-Type": {syncstream.TypeFrame}}, Data: js},
		{Subject: subject, Header: nats.Header{"Mesh-Type": {syncstream.TypeFrame}}, Data: js}, // a repeat: stale
	})
	natstest.Eventually(t, 5*time.Second, func() bool { a, st, _ := ss.Stats(); return a+st == 4 }, "good frames handled")
	if e, v := ss.Position(); e != epoch || v != version+2 {
		t.Errorf("position (%d, %d), want (%d, %d)", e, v, epoch, version+2)
	}
	mu.Lock()
	defer mu.Unlock()
	if a, st, _ := ss.Stats(); a != 3 || st != 1 || string(applied[1].Data) != "next" || string(applied[2].Data) != "json" {
		t.Errorf("applied %d stale %d, frames %+v", a, st, applied)
	}
}

var nuidSeq atomic.Int64

func nuidFor(testing.TB) string {
	return fmt.Sprintf("malformed-%d-%d", time.Now().UnixNano(), nuidSeq.Add(1))
}

// TestCloseFollowsQueuedFrames: Close while frames wait in the owner sends
// the closed frame after them, in the same order: the subscriber applies
// every frame published before Close, then subscribes again (and gets a
// fresh snapshot), over several rounds.
func TestCloseFollowsQueuedFrames(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	owner, _ := startNode(t, s, "owner", false)
	owned := startPublisher(t, owner)
	sub, _ := startNode(t, s, "sub", false)
	var mu sync.Mutex
	var got []syncstream.Frame
	ss, err := syncstream.Subscribe(context.Background(), sub, "pub/c", "", func(f syncstream.Frame) {
		mu.Lock()
		got = append(got, f)
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Stop()
	o := owned("pub/c")
	const each = 1000
	for round := 1; round <= 3; round++ {
		natstest.Eventually(t, 10*time.Second, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(got) > 0 && got[len(got)-1].Snapshot && o.Subscribers("") == 1
		}, "round %d: subscribed", round)
		mu.Lock()
		got = got[:0]
		mu.Unlock()
		base := o.Version("")
		for i := 0; i < each; i++ {
			o.Publish("", payloadOf(round, i, 200))
		}
		o.Close()
		natstest.Eventually(t, 10*time.Second, func() bool {
			_, _, re := ss.Stats()
			mu.Lock()
			defer mu.Unlock()
			return re >= int64(round) && len(got) == each+1 && got[each].Snapshot
		}, "round %d: every frame, then a resubscribe's snapshot", round)
		mu.Lock()
		for i, f := range got[:each] {
			if f.Snapshot || f.Version != base+uint64(i)+1 || checkPayload(f.Data) != nil {
				t.Fatalf("round %d: frame %d is (%d, snapshot %v)", round, i, f.Version, f.Snapshot)
			}
		}
		if v := got[each].Version; v != base+each {
			t.Errorf("round %d: snapshot version %d, want %d", round, v, base+each)
		}
		mu.Unlock()
	}
}
