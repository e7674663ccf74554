// Command rawingress is a mesh caller that uses nothing of natsmesh but its
// wire protocol (docs/protocol.md): plain nats.go requests to the ingress
// subject <prefix>.in.<addr>.<stream>, as a client in another language
// would send them. It shows what such a caller does so that a rolling
// restart of the NATS servers costs it nothing (docs/operations.md §12):
//
//  1. on its server's lame duck notice (nats.LameDuckModeHandler) it holds
//     new requests, waits up to 2 s for the replies in flight, and moves to
//     another server (nc.ForceReconnect) before the server closes it;
//  2. every delivery has its own Mesh-Id, kept across re-sends (the mesh
//     dedupes by it, and answers a duplicate of a handled request with its
//     kept response);
//  3. it re-sends only what the reply says is resendable — Mesh-Verdict
//     ShuttingDown, or Unavailable with Mesh-Reason no-placement or
//     deadline-unsent — and NATS no responders on the ingress;
//  4. a request whose connection dropped while it was in flight lost its
//     reply with the connection: it is re-sent under the same Mesh-Id once
//     reconnected; any other request without a reply has an unknown
//     outcome and is not re-sent.
//
// Usage (against a running mesh; NATS_URL as for the nats CLI):
//
//	go run ./examples/rawingress [-n 100] [-type TYPE] [-prefix mesh.v1] ADDRESS [PAYLOAD]
//
// It sends -n requests to ADDRESS one after another (-n 0: until SIGINT or
// SIGTERM) and prints each outcome and, at the end, how many failed, the
// slowest, how many were re-sent and why. Exit 0 if every request was
// answered Accepted, 1 otherwise. -naive sends as a caller that ignores
// these rules, for comparison.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"
)

func main() {
	n := flag.Int("n", 1, "requests to send, one after another")
	typ := flag.String("type", "", "Mesh-Type of each request")
	prefix := flag.String("prefix", "mesh.v1", "the mesh's subject prefix")
	quiet := flag.Bool("q", false, "print only the summary")
	naive := flag.Bool("naive", false, "for comparison: no lame duck handling, one attempt of 15 s, nothing re-sent (what a caller that ignores these rules sees)")
	flag.Parse()
	if flag.NArg() < 1 || flag.NArg() > 2 {
		fmt.Fprintln(os.Stderr, "usage: rawingress [-n N] [-type TYPE] [-prefix P] ADDRESS [PAYLOAD]")
		os.Exit(2)
	}
	url := os.Getenv("NATS_URL")
	if url == "" {
		url = nats.DefaultURL
	}
	dial := Dial
	if *naive {
		dial = DialNaive
	}
	c, err := dial(url, *prefix)
	if err != nil {
		fmt.Fprintln(os.Stderr, "rawingress:", err)
		os.Exit(2)
	}
	defer c.Close()
	subject, err := IngressSubject(*prefix, flag.Arg(0), "")
	if err != nil {
		fmt.Fprintln(os.Stderr, "rawingress:", err)
		os.Exit(2)
	}
	// -n 0: until SIGINT or SIGTERM.
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	failed, sent := 0, 0
	var slowest time.Duration
	for i := 0; *n == 0 || i < *n; i++ {
		select {
		case <-stop:
			*n = -1 // stop
		default:
		}
		if *n < 0 {
			break
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		start := time.Now()
		r, err := c.Request(ctx, subject, *typ, []byte(flag.Arg(1)), "")
		took := time.Since(start)
		cancel()
		sent++
		slowest = max(slowest, took)
		switch {
		case err != nil:
			failed++
			fmt.Printf("%d: %v\n", i, err)
		case r.Verdict != "Accepted":
			failed++
			fmt.Printf("%d: %s %s %q\n", i, r.Verdict, r.Reason, r.Message)
		case !*quiet:
			fmt.Printf("%d: %s %s (attempts %d) %q\n", i, r.Verdict, r.ID, r.Attempts, r.Payload)
		}
	}
	st := c.Stats()
	fmt.Printf("sent %d, failed %d, slowest %v; re-sent: %d after a resendable verdict, %d after no responders, %d after a dropped connection; moves on lame duck: %d\n",
		sent, failed, slowest.Round(time.Millisecond), st.ResentVerdict, st.ResentNoResponders, st.ResentDropped, st.Moves)
	if failed > 0 {
		os.Exit(1)
	}
}

// Caller sends requests to the mesh ingress with raw nats.go, following the
// rules above. Safe for concurrent use.
type Caller struct {
	nc *nats.Conn
	// AttemptTimeout bounds one attempt: above the ingress node's own
	// request timeout (30 s), which is when it answers at the latest.
	AttemptTimeout time.Duration
	// MaxAttempts bounds the attempts of one request.
	MaxAttempts int

	naive bool // DialNaive: one attempt, nothing re-sent

	mu       sync.Mutex
	lost     chan struct{} // closed when the current connection drops
	hold     chan struct{} // non-nil while moving off a server in lame duck mode
	inflight int
	stats    Stats
}

// Stats counts re-sends by cause, and moves.
type Stats struct {
	ResentVerdict, ResentNoResponders, ResentDropped, Moves int
}

// Reply is the mesh's answer to a request.
type Reply struct {
	ID       string // the Mesh-Id (sent, or the ingress's)
	Verdict  string // Mesh-Verdict
	Reason   string // Mesh-Reason
	Message  string // Mesh-Message
	Node     string // Mesh-Node
	Payload  []byte // the handler's response, for Accepted
	Attempts int
}

// ErrOutcomeUnknown: no reply came although the connection held: the mesh
// may hold the delivery, so it was not re-sent.
var ErrOutcomeUnknown = errors.New("no reply: outcome unknown, not re-sent")

// Dial connects to url (nats.go reconnects forever) as a Caller.
func Dial(url, prefix string) (*Caller, error) {
	c := &Caller{AttemptTimeout: 35 * time.Second, MaxAttempts: 10, lost: make(chan struct{})}
	nc, err := nats.Connect(url,
		nats.Name("rawingress"),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250*time.Millisecond),
		nats.LameDuckModeHandler(func(*nats.Conn) { go c.move() }),
		nats.DisconnectErrHandler(func(*nats.Conn, error) { c.dropped() }),
	)
	if err != nil {
		return nil, err
	}
	c.nc = nc
	return c, nil
}

// DialNaive connects as a caller that ignores the rules (for comparison):
// no lame duck handling, one attempt of 15 s (meshctl's default timeout),
// nothing re-sent.
func DialNaive(url, _ string) (*Caller, error) {
	nc, err := nats.Connect(url, nats.Name("rawingress-naive"), nats.MaxReconnects(-1), nats.ReconnectWait(250*time.Millisecond))
	if err != nil {
		return nil, err
	}
	return &Caller{nc: nc, naive: true, AttemptTimeout: 15 * time.Second, MaxAttempts: 1, lost: make(chan struct{})}, nil
}

// Close closes the connection.
func (c *Caller) Close() { c.nc.Close() }

// Conn returns the NATS connection.
func (c *Caller) Conn() *nats.Conn { return c.nc }

// Stats returns the counters.
func (c *Caller) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stats
}

// dropped marks the connection lost: attempts in flight on it lost their
// replies.
func (c *Caller) dropped() {
	c.mu.Lock()
	close(c.lost)
	c.lost = make(chan struct{})
	c.mu.Unlock()
}

// move holds new attempts, waits up to 2 s for those in flight, and
// reconnects to another server (the one in lame duck mode takes no new
// connections).
func (c *Caller) move() {
	c.mu.Lock()
	if c.hold != nil {
		c.mu.Unlock()
		return
	}
	hold := make(chan struct{})
	c.hold = hold
	c.stats.Moves++
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.hold = nil
		c.mu.Unlock()
		close(hold)
	}()
	quiet := time.Now().Add(2 * time.Second)
	for time.Now().Before(quiet) {
		c.mu.Lock()
		n := c.inflight
		c.mu.Unlock()
		if n == 0 {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	reconnects := c.nc.Stats().Reconnects
	if c.nc.ForceReconnect() != nil {
		return
	}
	back := time.Now().Add(10 * time.Second)
	for !(c.nc.IsConnected() && c.nc.Stats().Reconnects > reconnects) && time.Now().Before(back) && !c.nc.IsClosed() {
		time.Sleep(5 * time.Millisecond)
	}
}

// enter waits while the connection moves, then counts an attempt in
// flight and returns the channel that closes if its connection drops.
func (c *Caller) enter(ctx context.Context) (<-chan struct{}, error) {
	c.mu.Lock()
	for c.hold != nil {
		h := c.hold
		c.mu.Unlock()
		select {
		case <-h:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		c.mu.Lock()
	}
	c.inflight++
	lost := c.lost
	c.mu.Unlock()
	return lost, nil
}

func (c *Caller) leave() {
	c.mu.Lock()
	c.inflight--
	c.mu.Unlock()
}

func (c *Caller) count(f func(*Stats)) {
	c.mu.Lock()
	f(&c.stats)
	c.mu.Unlock()
}

// Resendable reports whether a reply's verdict and reason let the same
// delivery be sent again (docs/protocol.md §4.2): ShuttingDown always;
// Unavailable only for no-placement and deadline-unsent (nothing was sent);
// never Failed (a timeout or an unknown outcome may have run it), Ignored
// (overload) or activation-failed.
func Resendable(verdict, reason string) bool {
	switch verdict {
	case "ShuttingDown":
		return true
	case "Unavailable":
		return reason == "no-placement" || reason == "deadline-unsent"
	}
	return false
}

// Request sends payload to the ingress subject as a request
// (Mesh-Expect-Response) under id (a fresh one if empty) and returns the
// final reply: Accepted, or the first reply that is not resendable. Its
// error is ErrOutcomeUnknown when an attempt got no reply while the
// connection held, ctx's error, or the connection's.
func (c *Caller) Request(ctx context.Context, subject, typ string, payload []byte, id string) (Reply, error) {
	if id == "" {
		id = nuid.Next()
	}
	m := nats.NewMsg(subject)
	m.Header.Set("Mesh-Id", id)
	m.Header.Set("Mesh-Expect-Response", "true")
	if typ != "" {
		m.Header.Set("Mesh-Type", typ)
	}
	m.Data = payload
	wait := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		lost, err := c.enter(ctx)
		if err != nil {
			return Reply{ID: id, Attempts: attempt - 1}, err
		}
		actx, cancel := context.WithTimeout(ctx, c.AttemptTimeout)
		go func() { // the connection dropping ends the attempt: its reply is lost
			select {
			case <-lost:
				cancel()
			case <-actx.Done():
			}
		}()
		msg, err := c.nc.RequestMsgWithContext(actx, m)
		cancel()
		c.leave()
		dropped := false
		select {
		case <-lost:
			dropped = true
		default:
		}
		resend := false
		switch {
		case err == nil:
			r := Reply{ID: id, Verdict: msg.Header.Get("Mesh-Verdict"), Reason: msg.Header.Get("Mesh-Reason"),
				Message: msg.Header.Get("Mesh-Message"), Node: msg.Header.Get("Mesh-Node"), Payload: msg.Data, Attempts: attempt}
			if v := msg.Header.Get("Mesh-Id"); v != "" {
				r.ID = v
			}
			if r.Verdict == "Accepted" || !Resendable(r.Verdict, r.Reason) || attempt >= c.MaxAttempts {
				return r, nil
			}
			c.count(func(s *Stats) { s.ResentVerdict++ })
			resend = true
		case c.naive:
			return Reply{ID: id, Attempts: attempt}, err
		case errors.Is(err, nats.ErrNoResponders):
			// No node serves the ingress right now: nothing was delivered.
			c.count(func(s *Stats) { s.ResentNoResponders++ })
			resend = true
		case (dropped || errors.Is(err, nats.ErrDisconnected) || errors.Is(err, nats.ErrConnectionReconnecting)) && ctx.Err() == nil:
			// The connection dropped with the request in flight (or
			// before it left: nats.go says so before this caller's own
			// watch saw the drop): the reply, if any, was lost with it.
			// Same Mesh-Id again.
			c.count(func(s *Stats) { s.ResentDropped++ })
			resend = true
		case ctx.Err() != nil:
			return Reply{ID: id, Attempts: attempt}, ctx.Err()
		case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout):
			return Reply{ID: id, Attempts: attempt}, ErrOutcomeUnknown
		default:
			return Reply{ID: id, Attempts: attempt}, err
		}
		if resend && attempt >= c.MaxAttempts {
			return Reply{ID: id, Attempts: attempt}, fmt.Errorf("gave up after %d attempts: %w", attempt, err)
		}
		// Back off (resendable: nothing is held), and wait for the
		// connection to be back.
		select {
		case <-ctx.Done():
			return Reply{ID: id, Attempts: attempt}, ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, 2*time.Second)
		for !c.nc.IsConnected() && !c.nc.IsClosed() && ctx.Err() == nil {
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// IngressSubject returns <prefix>.in.<addr>.<stream> with the address and
// stream encoded as docs/protocol.md §2 says: A-Z a-z 0-9 - _ / verbatim,
// every other byte =HH, an empty stream a lone "=".
func IngressSubject(prefix, addr, stream string) (string, error) {
	if addr == "" || !strings.Contains(addr, "/") {
		return "", fmt.Errorf("address %q: want kind/id", addr)
	}
	return prefix + ".in." + token(addr) + "." + token(stream), nil
}

func token(s string) string {
	if s == "" {
		return "="
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		ch := s[i]
		switch {
		case ch >= 'A' && ch <= 'Z', ch >= 'a' && ch <= 'z', ch >= '0' && ch <= '9', ch == '-', ch == '_', ch == '/':
			b.WriteByte(ch)
		default:
			fmt.Fprintf(&b, "=%02X", ch)
		}
	}
	return b.String()
}
