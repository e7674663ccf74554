package mesh

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// lossyProxy forwards TCP connections to a NATS server. A test can make it
// lose everything in transit (bytes read in either direction are dropped,
// as when a server dies with messages in its buffers) and then close its
// connections, so that the client reconnects through it: a connection
// move, with no disconnect advisory (DESIGN §6).
type lossyProxy struct {
	target  string
	ln      net.Listener
	dropped atomic.Int64 // bytes lost

	mu     sync.Mutex
	losing bool
	lost   []byte // what was dropped since the last reset
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

// lostContains reports whether s was among the bytes dropped since the
// last reset.
func (p *lossyProxy) lostContains(s string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return bytes.Contains(p.lost, []byte(s))
}

func startLossyProxy(t *testing.T, s *server.Server) *lossyProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &lossyProxy{target: s.Addr().String(), ln: ln, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		ln.Close()
		p.reset()
		p.wg.Wait()
	})
	return p
}

func (p *lossyProxy) url() string { return "nats://" + p.ln.Addr().String() }

func (p *lossyProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.DialTimeout("tcp", p.target, 2*time.Second)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns[c], p.conns[up] = struct{}{}, struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pump(c, up)
		go p.pump(up, c)
	}
}

func (p *lossyProxy) pump(src, dst net.Conn) {
	defer p.wg.Done()
	defer src.Close()
	defer dst.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			losing := p.losing
			if losing {
				p.lost = append(p.lost, buf[:n]...)
			}
			p.mu.Unlock()
			if losing {
				p.dropped.Add(int64(n))
			} else if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				return
			}
			return
		}
	}
}

// lose makes the proxy drop everything in transit from now on.
func (p *lossyProxy) lose() {
	p.mu.Lock()
	p.losing = true
	p.mu.Unlock()
}

// reset closes every proxied connection and forwards again: the client
// reconnects through the proxy.
func (p *lossyProxy) reset() {
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	clear(p.conns)
	p.losing = false
	p.lost = nil
	p.mu.Unlock()
}

// movedPair starts an owner node (hosting "rec", its connection through a
// lossy proxy) and a sender node (hosting nothing, connected directly),
// both with membership, on s.
func movedPair(t *testing.T, s *server.Server, hc hub.Config) (owner, sender *Node, rec *recorder, p *lossyProxy, ownerConn *nats.Conn) {
	t.Helper()
	p = startLossyProxy(t, s)
	ownerConn, err := nats.Connect(p.url(), nats.ReconnectWait(10*time.Millisecond), nats.MaxReconnects(-1),
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ownerConn.Close)
	// A TTL far longer than any loss here: the owner is never expired.
	mc := MembershipConfig{Heartbeat: 100 * time.Millisecond, TTL: 10 * time.Second}
	owner, err = NewNode(NodeConfig{Conn: ownerConn, Name: "owner", Membership: &mc, Host: hc})
	if err != nil {
		t.Fatal(err)
	}
	rec = newRecorder()
	if err := owner.Register("rec", rec.factory); err != nil {
		t.Fatal(err)
	}
	if err := owner.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { owner.Close() })
	smc := mc
	sender, err = NewNode(NodeConfig{Conn: natstest.Connect(t, s), Name: "sender", Membership: &smc})
	if err != nil {
		t.Fatal(err)
	}
	if err := sender.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sender.Close() })
	natstest.Eventually(t, 10*time.Second, func() bool { return len(sender.Members().Hosting("rec")) == 1 }, "the sender sees the owner")
	return owner, sender, rec, p, ownerConn
}

// TestAwaitedRequestSurvivesOwnerMove: a Request whose leg, acceptance
// reply or response is lost in transit when its owner's connection moves
// (the owner keeps its generation: a server restart, lame duck) gets its
// response, and its handler runs exactly once. The loss is real (a proxy
// drops the bytes in both directions, then closes the owner's connection;
// the owner reconnects and announces the move), at every position: before
// the leg reaches the owner, from the handler's start (the acceptance reply
// may be lost too), just before the response, just after it, and with the
// response sent only once the owner is back. The re-sent leg and the
// re-sent awaited request are answered by the owner's dedupe (DESIGN §6).
func TestAwaitedRequestSurvivesOwnerMove(t *testing.T) {
	s := natstest.RunServer(t)
	owner, sender, rec, p, ownerConn := movedPair(t, s, hub.Config{})
	// moved is closed by the handler once the loss began; back is closed
	// by the test once the owner reconnected.
	var mu sync.Mutex
	var moved, back chan struct{}
	// acceptedSeen waits until the sender read d's acceptance: from then on
	// only the response is in transit.
	acceptedSeen := func(id string) {
		for sender.Client.countFlights(func(f *flight) bool { return f.id == id && f.phase == phaseAccepted }) == 0 {
			time.Sleep(time.Millisecond)
		}
	}
	rec.fn = func(ctx context.Context, d *hub.Delivery) error {
		mu.Lock()
		mv, bk := moved, back
		mu.Unlock()
		resp := []byte("re:" + d.ID)
		switch d.Type {
		case "reply": // the acceptance reply may be in transit still
			p.lose()
			close(mv)
			time.Sleep(10 * time.Millisecond)
			return d.Respond(resp)
		case "response":
			acceptedSeen(d.ID)
			p.lose()
			err := d.Respond(resp)
			close(mv)
			return err
		case "after-response":
			err := d.Respond(resp)
			p.lose()
			close(mv)
			return err
		case "after-move":
			acceptedSeen(d.ID)
			p.lose()
			close(mv)
			<-bk
			return d.Respond(resp)
		}
		return d.Respond(resp) // "leg": the loss began before it was sent
	}
	positions := []string{"leg", "reply", "response", "after-response", "after-move"}
	for rep := range reps(t, 30) {
		pos := positions[rep%len(positions)]
		id := fmt.Sprintf("moved-%d-%s", rep, pos)
		mu.Lock()
		moved, back = make(chan struct{}), make(chan struct{})
		mv, bk := moved, back
		mu.Unlock()
		reconnects := ownerConn.Stats().Reconnects
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		type result struct {
			resp Response
			err  error
		}
		done := make(chan result, 1)
		if pos == "leg" {
			p.lose()
		}
		go func() {
			r, err := sender.Request(ctx, Delivery{ID: id, To: "rec/m", Type: pos})
			done <- result{r, err}
		}()
		if pos == "leg" {
			natstest.Eventually(t, 10*time.Second, func() bool {
				return sender.Client.countFlights(func(f *flight) bool { return f.id == id && f.phase == phaseSent }) == 1
			}, "rep %d: the leg in flight", rep)
		} else {
			<-mv
		}
		// What must be lost at this position is lost before the move.
		switch pos {
		case "leg":
			natstest.Eventually(t, 10*time.Second, func() bool { return p.lostContains(id) }, "rep %d: the leg lost", rep)
		case "reply", "response":
			natstest.Eventually(t, 10*time.Second, func() bool { return p.lostContains("re:" + id) }, "rep %d: the response lost", rep)
		default:
			natstest.Eventually(t, 10*time.Second, func() bool { return p.dropped.Load() > 0 }, "rep %d: bytes lost", rep)
		}
		resent := sender.Client.Stats().Resent
		p.reset()
		natstest.Eventually(t, 10*time.Second, func() bool {
			return ownerConn.IsConnected() && ownerConn.Stats().Reconnects > reconnects
		}, "rep %d: the owner reconnected", rep)
		if pos == "after-move" {
			// The handler still runs: the re-send is answered Accepted,
			// and the response comes once it is sent.
			natstest.Eventually(t, 10*time.Second, func() bool { return sender.Client.Stats().Resent > resent }, "rep %d: re-sent while running", rep)
		}
		close(bk)
		res := <-done
		cancel()
		if res.err != nil || string(res.resp.Payload) != "re:"+id {
			t.Fatalf("rep %d (%s): %q %v; want the response", rep, pos, res.resp.Payload, res.err)
		}
		if n := rec.executions(id); n != 1 {
			t.Fatalf("rep %d (%s): the handler ran %d times", rep, pos, n)
		}
		if res.resp.Node != owner.ID() {
			t.Fatalf("rep %d (%s): answered by %v, want the owner %v (same generation)", rep, pos, res.resp.Node, owner.ID())
		}
		if (pos == "response" || pos == "after-move") && sender.Client.Stats().Resent == resent {
			t.Fatalf("rep %d (%s): the owner moved while the response was awaited, and the request was not re-sent", rep, pos)
		}
	}
	st := sender.Client.Stats()
	t.Logf("%d requests across %d loss positions: every one answered, each handler once; %d awaited requests re-sent, %d retries, %d unmatched (duplicate) responses",
		reps(t, 30), len(positions), st.Resent, st.Retries, st.Unmatched)
}

// TestAwaitedRequestResponseGone: when the owner no longer keeps the
// response of a handled Request whose response was lost in transit as its
// connection moved, the re-sent request is answered verdict.ErrResponseGone
// (Failed: the handler ran once) — never silence, never a timeout.
func TestAwaitedRequestResponseGone(t *testing.T) {
	s := natstest.RunServer(t)
	_, sender, rec, p, ownerConn := movedPair(t, s, hub.Config{DedupeResponseBytes: -1})
	var moved chan struct{}
	var mu sync.Mutex
	rec.fn = func(ctx context.Context, d *hub.Delivery) error {
		mu.Lock()
		mv := moved
		mu.Unlock()
		for sender.Client.countFlights(func(f *flight) bool { return f.id == d.ID && f.phase == phaseAccepted }) == 0 {
			time.Sleep(time.Millisecond)
		}
		p.lose()
		err := d.Respond([]byte("lost"))
		close(mv)
		return err
	}
	for rep := range reps(t, 5) {
		mu.Lock()
		moved = make(chan struct{})
		mv := moved
		mu.Unlock()
		reconnects := ownerConn.Stats().Reconnects
		id := fmt.Sprintf("gone-%d", rep)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		done := make(chan error, 1)
		go func() {
			_, err := sender.Request(ctx, Delivery{ID: id, To: "rec/g"})
			done <- err
		}()
		<-mv
		natstest.Eventually(t, 10*time.Second, func() bool { return p.lostContains("lost") }, "the response lost")
		p.reset()
		natstest.Eventually(t, 10*time.Second, func() bool {
			return ownerConn.IsConnected() && ownerConn.Stats().Reconnects > reconnects
		}, "the owner reconnected")
		err := <-done
		cancel()
		if !errors.Is(err, verdict.ErrResponseGone) || verdict.IsTransient(err) || errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("rep %d: %v; want verdict.ErrResponseGone", rep, err)
		}
		if n := rec.executions(id); n != 1 {
			t.Fatalf("rep %d: the handler ran %d times", rep, n)
		}
	}
}

// TestMoveConnectionLosesNoAwaitedResponse: moving the client's connection
// (as LameDuckHandler does when its server announces lame duck mode) waits
// for the awaited response before it reconnects, so the Request gets it
// instead of outcome-unknown; a delivery started during the move waits for
// it and then goes through.
func TestMoveConnectionLosesNoAwaitedResponse(t *testing.T) {
	s := natstest.RunServer(t)
	n, rec := testNode(t, s, "a")
	var mu sync.Mutex
	var release chan struct{}
	rec.fn = func(ctx context.Context, d *hub.Delivery) error {
		if d.Type == "block" {
			mu.Lock()
			r := release
			mu.Unlock()
			<-r
		}
		return d.Respond([]byte("ok"))
	}
	nc := natstest.Connect(t, s, nats.ReconnectWait(10*time.Millisecond))
	c := newClient(t, nc, StaticResolver{Node: n.ID()})
	for rep := range reps(t, 10) {
		mu.Lock()
		release = make(chan struct{})
		r := release
		mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		req := make(chan error, 1)
		go func() {
			resp, err := c.Request(ctx, Delivery{To: "rec/x", Type: "block"})
			if err == nil && string(resp.Payload) != "ok" {
				err = fmt.Errorf("response %q", resp.Payload)
			}
			req <- err
		}()
		natstest.Eventually(t, 10*time.Second, func() bool { return c.awaiting() == 1 }, "rep %d: accepted", rep)
		before := nc.Stats().Reconnects
		moved := make(chan error, 1)
		go func() { moved <- c.MoveConnection(ctx) }()
		natstest.Eventually(t, 10*time.Second, func() bool { return c.moving.Load() != nil }, "rep %d: moving", rep)
		dlv := make(chan error, 1)
		go func() {
			_, err := c.Deliver(ctx, Delivery{To: "rec/y"})
			dlv <- err
		}()
		close(r)
		if err := <-req; err != nil {
			t.Fatalf("rep %d: the awaited request: %v; want its response", rep, err)
		}
		if err := <-moved; err != nil {
			t.Fatalf("rep %d: move: %v", rep, err)
		}
		if nc.Stats().Reconnects <= before {
			t.Fatalf("rep %d: the connection did not move", rep)
		}
		if err := <-dlv; err != nil {
			t.Fatalf("rep %d: a delivery during the move: %v", rep, err)
		}
		cancel()
	}
}

// TestMoveConnectionLosesNoIngressRequest: raw ingress callers send
// without pause while the node serving their ingress moves its connection
// again and again (the server announced lame duck mode). An ingress request
// the server had already written towards the node when the connection
// closed would be lost with it, and its caller, whose own link held, would
// wait out its timeout with the outcome unknown: the move first drains the
// ingress subscription, so every request gets a reply (NATS no responders
// while no node takes the ingress is answered at once, and re-sent).
func TestMoveConnectionLosesNoIngressRequest(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	n, rec := testNode(t, s, "a")
	rec.fn = func(_ context.Context, d *hub.Delivery) error { return d.Respond(d.Payload) }
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var answered, noResponders atomic.Int64
	lost := make(chan string, 64)
	for w := range 4 {
		nc := natstest.Connect(t, s)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				id := fmt.Sprintf("w%d-%d", w, i)
				m := nats.NewMsg(subjects.DefaultPrefix.Ingress(subjects.Address(fmt.Sprintf("rec/%d", w)), ""))
				m.Header.Set(hub.HeaderID, id)
				m.Header.Set(hub.HeaderExpectResponse, "true")
				m.Data = []byte(id)
				for {
					r, err := nc.RequestMsg(m, 10*time.Second)
					if errors.Is(err, nats.ErrNoResponders) {
						noResponders.Add(1)
						continue // nothing was delivered: the same Mesh-Id again
					}
					switch {
					case err != nil:
						lost <- fmt.Sprintf("%s: %v", id, err)
					case r.Header.Get("Mesh-Verdict") != "Accepted" || string(r.Data) != id:
						lost <- fmt.Sprintf("%s: %v %q", id, r.Header, r.Data)
					default:
						answered.Add(1)
					}
					break
				}
			}
		}()
	}
	moves := reps(t, 30)
	for rep := range moves {
		before := answered.Load()
		natstest.Eventually(t, 10*time.Second, func() bool { return answered.Load() > before+50 }, "rep %d: ingress traffic flowing", rep)
		ctx, cancel := context.WithTimeout(context.Background(), DefaultMoveTimeout)
		err := n.MoveConnection(ctx)
		cancel()
		if err != nil {
			t.Fatalf("rep %d: move: %v", rep, err)
		}
	}
	before := answered.Load()
	natstest.Eventually(t, 10*time.Second, func() bool { return answered.Load() > before+50 }, "ingress traffic flowing after the moves")
	close(stop)
	wg.Wait()
	close(lost)
	for l := range lost {
		t.Errorf("an ingress request lost across a move: %s", l)
	}
	t.Logf("%d moves, %d ingress requests answered, %d no-responders answers re-sent", moves, answered.Load(), noResponders.Load())
}
