package mesh

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/verdict"
)

// brokenDialer dials NATS through connections whose writes the test can
// break: a broken one fails every write with EPIPE ("write: broken pipe",
// as a socket whose peer went away does) while its reads go on, until the
// test cuts it (the read side notices) and nats.go reconnects through a
// fresh one.
type brokenDialer struct {
	mu    sync.Mutex
	conns []*brokenConn
}

type brokenConn struct {
	net.Conn
	broken atomic.Bool
	failed atomic.Int64 // writes refused while broken
}

func (c *brokenConn) Write(p []byte) (int, error) {
	if c.broken.Load() {
		c.failed.Add(1)
		return 0, &net.OpError{Op: "write", Net: "tcp", Addr: c.RemoteAddr(), Err: os.NewSyscallError("write", syscall.EPIPE)}
	}
	return c.Conn.Write(p)
}

func (d *brokenDialer) Dial(network, address string) (net.Conn, error) {
	c, err := net.Dial(network, address)
	if err != nil {
		return nil, err
	}
	bc := &brokenConn{Conn: c}
	d.mu.Lock()
	d.conns = append(d.conns, bc)
	d.mu.Unlock()
	return bc, nil
}

func (d *brokenDialer) current() *brokenConn {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.conns[len(d.conns)-1]
}

// TestPublishFailedIsResendable: a leg whose publish fails because the
// sender's own connection is broken (nats.go returns the socket's raw
// "write: broken pipe" from a publish that flushes) was not sent: its
// verdict is resendable (DESIGN §3, §6), so the delivery is sent again
// after the reconnect and accepted, handled once — never a terminal
// Failed with an unknown reason. For a plain delivery, a Request, and each
// position of a burst on one lane (the leg whose publish fails first, with
// legs behind it). The distinction is kept: a Request accepted before its
// sender's link dropped, its response awaited, still ends outcome-unknown.
func TestPublishFailedIsResendable(t *testing.T) {
	s := natstest.RunServer(t)
	n, rec := testNode(t, s, "a")
	hold := make(chan struct{})
	var holdOnce sync.Once
	unhold := func() { holdOnce.Do(func() { close(hold) }) }
	t.Cleanup(unhold)
	rec.fn = func(_ context.Context, d *hub.Delivery) error {
		if d.Type == "hold" {
			<-hold
		}
		return d.Respond([]byte("ok"))
	}
	big := make([]byte, 64<<10) // over nats.go's 32 KiB write buffer: the publish flushes, and fails, at once
	sender := func(t *testing.T) (*Client, *brokenDialer) {
		d := &brokenDialer{}
		nc := natstest.ConnectURL(t, s.ClientURL(), nats.SetCustomDialer(d), nats.ReconnectWait(20*time.Millisecond), nats.MaxReconnects(-1),
			nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {})) // the broken pipe is expected
		return newClient(t, nc, StaticResolver{Node: n.ID()}), d
	}
	// breakAndHeal breaks the sender's connection, waits until a write
	// failed on it, then cuts it so that nats.go reconnects.
	breakAndHeal := func(t *testing.T, d *brokenDialer) {
		bc := d.current()
		bc.broken.Store(true)
		natstest.Eventually(t, 10*time.Second, func() bool { return bc.failed.Load() > 0 }, "a write refused")
		_ = bc.Conn.Close()
	}
	wantOnce := func(t *testing.T, ids ...string) {
		t.Helper()
		natstest.Eventually(t, 10*time.Second, func() bool {
			for _, id := range ids {
				if rec.executions(id) != 1 {
					return false
				}
			}
			return true
		}, "each handled once")
	}
	ctxFor := func(t *testing.T) context.Context {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		t.Cleanup(cancel)
		return ctx
	}
	for rep := range 3 {
		t.Run(fmt.Sprint("deliver-", rep), func(t *testing.T) {
			c, d := sender(t)
			id := fmt.Sprint("d-", rep)
			done := make(chan error, 1)
			bc := d.current()
			bc.broken.Store(true)
			go func() { _, err := c.Deliver(ctxFor(t), Delivery{ID: id, To: "rec/x", Payload: big}); done <- err }()
			natstest.Eventually(t, 10*time.Second, func() bool { return bc.failed.Load() > 0 }, "a write refused")
			select {
			case err := <-done: // the verdict came before the link was seen down
				t.Fatalf("a leg whose publish failed: %v (%s, resendable %v), want it sent again", err, verdict.Classify(err), verdict.IsResendable(err))
			default:
			}
			_ = bc.Conn.Close()
			if err := <-done; err != nil {
				t.Fatalf("a leg whose publish failed: %v (%s, resendable %v), want it sent again", err, verdict.Classify(err), verdict.IsResendable(err))
			}
			wantOnce(t, id)
		})
		t.Run(fmt.Sprint("request-", rep), func(t *testing.T) {
			c, d := sender(t)
			id := fmt.Sprint("r-", rep)
			done := make(chan error, 1)
			go func() {
				resp, err := c.Request(ctxFor(t), Delivery{ID: id, To: "rec/x", Payload: big})
				if err == nil && string(resp.Payload) != "ok" {
					err = fmt.Errorf("response %q", resp.Payload)
				}
				done <- err
			}()
			breakAndHeal(t, d)
			if err := <-done; err != nil {
				t.Fatalf("a request whose publish failed: %v (%s, resendable %v), want it sent again", err, verdict.Classify(err), verdict.IsResendable(err))
			}
			wantOnce(t, id)
		})
	}
	for pos := range 4 {
		t.Run(fmt.Sprint("burst-broken-at-", pos), func(t *testing.T) {
			c, d := sender(t)
			const burst = 6
			var ids []string
			results := make(chan error, burst)
			for i := range burst {
				if i == pos {
					d.current().broken.Store(true) // the burst's legs from here on find it broken
				}
				id := fmt.Sprintf("b%d-%d", pos, i)
				ids = append(ids, id)
				c.DeliverAsyncFunc(ctxFor(t), Delivery{ID: id, To: "rec/burst", Stream: "s", Payload: big}, func(r Result) { results <- r.Err })
			}
			bc := d.current()
			natstest.Eventually(t, 10*time.Second, func() bool { return bc.failed.Load() > 0 }, "a write refused")
			_ = bc.Conn.Close()
			for range burst {
				if err := <-results; err != nil {
					t.Errorf("a burst delivery: %v (%s, resendable %v), want it sent again", err, verdict.Classify(err), verdict.IsResendable(err))
				}
			}
			wantOnce(t, ids...)
		})
	}
	t.Run("accepted-then-link-dropped", func(t *testing.T) {
		c, d := sender(t)
		done := make(chan error, 1)
		go func() {
			_, err := c.Request(ctxFor(t), Delivery{ID: "held", To: "rec/held", Type: "hold"})
			done <- err
		}()
		natstest.Eventually(t, 10*time.Second, func() bool { return rec.executions("held") == 1 && c.awaiting() == 1 }, "the request accepted, its handler running")
		_ = d.current().Conn.Close() // its response is awaited: the outcome is unknown
		err := <-done
		unhold()
		if !errors.Is(err, verdict.ErrOutcomeUnknown) || verdict.IsResendable(err) {
			t.Fatalf("an accepted request whose sender's link dropped: %v, want outcome-unknown", err)
		}
	})
}
