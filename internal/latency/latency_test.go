package latency

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/internal/natstest"
)

const oneWay = time.Millisecond

// startProxy starts a proxy in front of s with the given one-way latency and
// closes it when the test ends.
func startProxy(t *testing.T, s *server.Server, d time.Duration) *Proxy {
	t.Helper()
	p, err := Start(s.Addr().String(), d)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return p
}

// echoResponder connects directly to s and replies to every request on subj
// with the request's payload.
func echoResponder(t *testing.T, s *server.Server, subj string) *nats.Conn {
	t.Helper()
	nc := natstest.Connect(t, s)
	if _, err := nc.Subscribe(subj, func(m *nats.Msg) {
		if err := m.Respond(m.Data); err != nil {
			t.Errorf("respond: %v", err)
		}
	}); err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatalf("flush: %v", err)
	}
	return nc
}

func (p *Proxy) numLinks() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.links)
}

// waitGoroutines polls until the number of goroutines is at most n.
func waitGoroutines(t *testing.T, n int) {
	t.Helper()
	natstest.Eventually(t, 3*time.Second, func() bool { return runtime.NumGoroutine() <= n },
		"goroutines: want <= %d, have %d", n, runtime.NumGoroutine())
}

func TestStartRejectsBadArguments(t *testing.T) {
	if p, err := Start("127.0.0.1:4222", -time.Millisecond); err == nil {
		p.Close()
		t.Fatal("Start with negative latency: want error")
	}
	if p, err := Start("no-port", oneWay); err == nil {
		p.Close()
		t.Fatal("Start with target without port: want error")
	}
}

func TestAddrAndURL(t *testing.T) {
	s := natstest.RunServer(t, natstest.WithoutJetStream())
	p := startProxy(t, s, oneWay)
	host, port, err := net.SplitHostPort(p.Addr())
	if err != nil || host != "127.0.0.1" {
		t.Fatalf("Addr() = %q: want 127.0.0.1:port (%v)", p.Addr(), err)
	}
	if n, err := strconv.Atoi(port); err != nil || n == 0 {
		t.Fatalf("Addr() = %q: bad port", p.Addr())
	}
	if want := "nats://" + p.Addr(); p.URL() != want {
		t.Fatalf("URL() = %q, want %q", p.URL(), want)
	}
}

// A request/reply round trip crosses the proxy twice, so it takes at least
// 2 × oneWay. This checks that the delay is applied, not how fast it is.
func TestRoundTripDelay(t *testing.T) {
	s := natstest.RunServer(t, natstest.WithoutJetStream())
	echoResponder(t, s, "echo")
	p := startProxy(t, s, oneWay)
	nc := natstest.ConnectURL(t, p.URL())

	if _, err := nc.Request("echo", []byte("warm-up"), 5*time.Second); err != nil {
		t.Fatalf("warm-up request: %v", err)
	}
	minRTT := time.Duration(1<<63 - 1)
	for i := range 20 {
		want := []byte(fmt.Sprintf("req-%d", i))
		start := time.Now()
		m, err := nc.Request("echo", want, 5*time.Second)
		rtt := time.Since(start)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if !bytes.Equal(m.Data, want) {
			t.Fatalf("request %d: reply %q, want %q", i, m.Data, want)
		}
		minRTT = min(minRTT, rtt)
	}
	if floor := 2 * oneWay * 9 / 10; minRTT < floor {
		t.Fatalf("min round trip over 20 requests = %v, want >= %v (2 x %v one-way)", minRTT, floor, oneWay)
	}
	t.Logf("min round trip through proxy: %v", minRTT)
}

// 200 requests in flight at once finish in about one round trip, not 200:
// the proxy is a delay line, not stop-and-wait. Replies keep their order.
func TestPipelining(t *testing.T) {
	const n = 200
	s := natstest.RunServer(t, natstest.WithoutJetStream())
	echoResponder(t, s, "echo")
	p := startProxy(t, s, oneWay)
	nc := natstest.ConnectURL(t, p.URL())

	inbox := nats.NewInbox()
	replies := make(chan *nats.Msg, n)
	if _, err := nc.ChanSubscribe(inbox+".*", replies); err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	if err := nc.Flush(); err != nil { // the subscription reaches the server
		t.Fatalf("flush: %v", err)
	}

	start := time.Now()
	for i := range n {
		if err := nc.PublishRequest("echo", inbox+"."+strconv.Itoa(i), []byte(strconv.Itoa(i))); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	if err := nc.FlushTimeout(5 * time.Second); err != nil {
		t.Fatalf("flush: %v", err)
	}
	timeout := time.After(5 * time.Second)
	for i := range n {
		select {
		case m := <-replies:
			want := strconv.Itoa(i)
			if string(m.Data) != want || m.Subject != inbox+"."+want {
				t.Fatalf("reply %d: subject %q data %q, want data %q in order", i, m.Subject, m.Data, want)
			}
		case <-timeout:
			t.Fatalf("only %d of %d replies in 5s", i, n)
		}
	}
	elapsed := time.Since(start)
	serial := n * 2 * oneWay
	t.Logf("%d pipelined requests through proxy: %v (serial would be >= %v)", n, elapsed, serial)
	if elapsed < 2*oneWay*9/10 {
		t.Fatalf("%d requests took %v: less than one round trip, delay not applied", n, elapsed)
	}
	// Pipelined, the requests share their delays; serial, they would take
	// at least serial. The bound sits between the two, well above what a
	// busy machine adds (163 ms once for 200 requests while the rest of
	// the test suite ran).
	if limit := serial * 3 / 4; elapsed >= limit {
		t.Fatalf("%d pipelined requests took %v, want < %v (serial would be >= %v)", n, elapsed, limit, serial)
	}
}

// A payload much larger than one read chunk arrives intact in both
// directions.
func TestLargePayloadIntact(t *testing.T) {
	s := natstest.RunServer(t, natstest.WithoutJetStream())
	echoResponder(t, s, "echo")
	p := startProxy(t, s, oneWay)
	nc := natstest.ConnectURL(t, p.URL())

	want := make([]byte, 512<<10)
	rand.Read(want)
	for i := range 3 {
		m, err := nc.Request("echo", want, 5*time.Second)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if !bytes.Equal(m.Data, want) {
			t.Fatalf("request %d: reply of %d bytes differs from the %d bytes sent", i, len(m.Data), len(want))
		}
	}
}

// Close is idempotent and safe to call concurrently, closes live proxied
// connections, and leaves no goroutines behind.
func TestCloseIdempotentNoLeak(t *testing.T) {
	s := natstest.RunServer(t, natstest.WithoutJetStream())
	echoResponder(t, s, "echo")
	before := runtime.NumGoroutine()

	p, err := Start(s.Addr().String(), oneWay)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	var conns []*nats.Conn
	for range 3 {
		nc := natstest.ConnectURL(t, p.URL(), nats.NoReconnect())
		if _, err := nc.Request("echo", []byte("x"), 5*time.Second); err != nil {
			t.Fatalf("request: %v", err)
		}
		conns = append(conns, nc)
	}
	if got := p.numLinks(); got != 3 {
		t.Fatalf("proxied connections = %d, want 3", got)
	}

	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			if err := p.Close(); err != nil {
				t.Errorf("concurrent Close: %v", err)
			}
		})
	}
	wg.Wait()
	if err := p.Close(); err != nil {
		t.Fatalf("Close again: %v", err)
	}
	if got := p.numLinks(); got != 0 {
		t.Fatalf("proxied connections after Close = %d, want 0", got)
	}
	for i, nc := range conns {
		natstest.Eventually(t, 3*time.Second, nc.IsClosed, "client %d still open after proxy Close", i)
	}
	if c, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		c.Close()
		t.Fatalf("dial %s after Close succeeded", p.Addr())
	}
	waitGoroutines(t, before)
}

// When the client side closes, the proxy closes the server side too and its
// link goroutines exit, while the proxy keeps accepting.
func TestClientCloseReleasesLink(t *testing.T) {
	s := natstest.RunServer(t, natstest.WithoutJetStream())
	echoResponder(t, s, "echo")
	p := startProxy(t, s, oneWay)
	idle := runtime.NumGoroutine() // server, responder and the accept loop

	nc := natstest.ConnectURL(t, p.URL(), nats.NoReconnect())
	if _, err := nc.Request("echo", []byte("x"), 5*time.Second); err != nil {
		t.Fatalf("request: %v", err)
	}
	natstest.Eventually(t, 3*time.Second, func() bool { return s.NumClients() == 2 }, "server clients != 2")
	nc.Close()
	natstest.Eventually(t, 3*time.Second, func() bool { return p.numLinks() == 0 }, "link not released after client close")
	natstest.Eventually(t, 3*time.Second, func() bool { return s.NumClients() == 1 }, "server side of link still open")
	waitGoroutines(t, idle)

	// Still accepting.
	nc2 := natstest.ConnectURL(t, p.URL())
	if _, err := nc2.Request("echo", []byte("y"), 5*time.Second); err != nil {
		t.Fatalf("request on new connection: %v", err)
	}
}

// When the server side closes, the proxy closes the client side too.
func TestServerCloseClosesClient(t *testing.T) {
	s := natstest.RunServer(t, natstest.WithoutJetStream())
	p := startProxy(t, s, oneWay)
	nc := natstest.ConnectURL(t, p.URL(), nats.NoReconnect())
	if err := nc.Flush(); err != nil {
		t.Fatalf("flush: %v", err)
	}
	s.Shutdown()
	natstest.Eventually(t, 3*time.Second, nc.IsClosed, "client still open after server shutdown")
	natstest.Eventually(t, 3*time.Second, func() bool { return p.numLinks() == 0 }, "link not released after server close")
}

// A target that refuses connections makes the proxy close the accepted
// connection rather than hang.
func TestUnreachableTarget(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	target := ln.Addr().String()
	ln.Close() // nothing listens there now

	p, err := Start(target, oneWay)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	defer p.Close()
	c, err := net.DialTimeout("tcp", p.Addr(), time.Second)
	if err != nil {
		t.Fatalf("dial proxy: %v", err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(3 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil || strings.Contains(err.Error(), "timeout") {
		t.Fatalf("read from proxy with unreachable target: %v, want connection closed", err)
	}
}
