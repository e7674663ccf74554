// Package latency is a loopback TCP proxy for tests that delays every byte by a fixed one-way latency in each direction, preserving order and throughput (it is a delay line, not a rate limiter).
//
// Each chunk read from one side is stamped with the time it was read and
// written to the other side at that time plus the one-way latency. Chunks
// queue up inside the delay, so many messages can be in flight at once: a
// request/reply through the proxy costs about 2 × oneWay, while a pipeline of
// requests costs about 2 × oneWay in total, not per message.
//
// When one side closes (or a read or write fails), the data already queued
// in that direction is still delivered at its due time, then both sides of
// the connection are closed; data still queued in the other direction is
// dropped. There is no half-close.
//
// The proxy is meant for tests only: it listens on 127.0.0.1, never reorders
// data, and adds no bandwidth limit.
package latency

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
)

const (
	// readBufSize is the largest chunk read from one side in one call.
	readBufSize = 32 << 10
	// queueLen is how many chunks may wait in the delay line of one
	// direction before the reader blocks (back-pressure).
	queueLen = 4096
)

// Proxy is a running latency proxy. Its methods are safe for concurrent use.
type Proxy struct {
	ln     net.Listener
	target string
	oneWay time.Duration

	ctx    context.Context // cancelled by Close; aborts dials in progress
	cancel context.CancelFunc

	mu     sync.Mutex
	closed bool
	links  map[*link]struct{}

	wg        sync.WaitGroup // every goroutine the proxy started
	closeOnce sync.Once
	closeErr  error
}

// link is one proxied connection: the accepted client side and the dialled
// target side.
type link struct {
	client, server net.Conn
	done           chan struct{} // closed by shut
	once           sync.Once
	running        int // reader and writer goroutines still running; guarded by Proxy.mu
}

// shut closes both sides of l; it is idempotent and never blocks.
func (l *link) shut() {
	l.once.Do(func() {
		close(l.done)
		l.client.Close()
		l.server.Close()
	})
}

// chunk is data read from one side, due to be written to the other.
type chunk struct {
	data []byte
	due  time.Time
}

// Start listens on 127.0.0.1:0 and forwards each accepted connection to target ("host:port"), delaying data by oneWay in each direction. Closing the proxy closes all connections and waits for its goroutines.
//
// oneWay is a wall-clock duration and must not be negative; zero forwards
// without delay. Start returns once the listener is open and does not dial
// target itself: each accepted connection dials target, and if that dial
// fails the accepted connection is closed. The caller must call Close.
func Start(target string, oneWay time.Duration) (*Proxy, error) {
	if oneWay < 0 {
		return nil, fmt.Errorf("latency: negative one-way latency %v", oneWay)
	}
	if _, _, err := net.SplitHostPort(target); err != nil {
		return nil, fmt.Errorf("latency: target %q: %w", target, err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("latency: listen: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{
		ln:     ln,
		target: target,
		oneWay: oneWay,
		ctx:    ctx,
		cancel: cancel,
		links:  make(map[*link]struct{}),
	}
	p.wg.Add(1)
	go p.acceptLoop()
	return p, nil
}

// Addr returns the proxy's listening address, "127.0.0.1:port". It does not
// block.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// URL returns the proxy's address as a NATS URL, "nats://127.0.0.1:port". It
// does not block.
func (p *Proxy) URL() string { return "nats://" + p.Addr() }

// Close stops accepting, closes every proxied connection on both sides
// (dropping data still inside the delay line), and blocks until every
// goroutine the proxy started has returned. It is idempotent: later calls
// wait the same way and return the first call's result.
func (p *Proxy) Close() error {
	p.closeOnce.Do(func() {
		p.cancel()
		p.mu.Lock()
		p.closed = true
		for l := range p.links {
			l.shut()
		}
		p.mu.Unlock()
		if err := p.ln.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			p.closeErr = err
		}
	})
	p.wg.Wait()
	return p.closeErr
}

func (p *Proxy) acceptLoop() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			// Any other accept error is permanent for a loopback
			// listener; stop accepting, Close still cleans up.
			return
		}
		// Dial in its own goroutine so one slow dial does not hold up
		// other accepts; the accept loop is still running, so the
		// WaitGroup counter is positive and Add is safe.
		p.wg.Add(1)
		go p.connect(c)
	}
}

// connect dials the target for the accepted client c and starts the four
// goroutines of the link.
func (p *Proxy) connect(c net.Conn) {
	defer p.wg.Done()
	var d net.Dialer
	s, err := d.DialContext(p.ctx, "tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	l := &link{client: c, server: s, done: make(chan struct{})}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		l.shut()
		return
	}
	p.links[l] = struct{}{}
	// Two directions, each a reader and a writer. wg.Add happens under mu
	// so that Close, which sets closed under mu, cannot miss them.
	l.running = 4
	p.wg.Add(4)
	p.mu.Unlock()

	p.pipe(l, c, s)
	p.pipe(l, s, c)
}

// exit is deferred by each of a link's four goroutines; the last one to
// return forgets the link.
func (p *Proxy) exit(l *link) {
	p.mu.Lock()
	l.running--
	if l.running == 0 {
		delete(p.links, l)
	}
	p.mu.Unlock()
	p.wg.Done()
}

// pipe starts the reader and writer goroutines that carry src to dst through
// the delay line. The caller has already counted both in p.wg and l.running.
func (p *Proxy) pipe(l *link, src, dst net.Conn) {
	q := make(chan chunk, queueLen)

	// Reader: stamp each chunk with its read time and queue it. On any
	// read error (EOF included) stop queueing; the writer flushes what is
	// queued and then shuts the link.
	go func() {
		defer p.exit(l)
		defer close(q)
		buf := make([]byte, readBufSize)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				due := time.Now().Add(p.oneWay)
				data := make([]byte, n)
				copy(data, buf[:n])
				select {
				case q <- chunk{data: data, due: due}:
				case <-l.done:
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()

	// Writer: wait until each chunk is due, then write it. When the queue
	// is closed (src ended) or a write fails, shut both sides.
	go func() {
		defer p.exit(l)
		defer l.shut()
		timer := time.NewTimer(time.Hour)
		timer.Stop()
		defer timer.Stop()
		for c := range q {
			if wait := time.Until(c.due); wait > 0 {
				timer.Reset(wait)
				select {
				case <-timer.C:
				case <-l.done:
					return
				}
			}
			if _, err := dst.Write(c.data); err != nil {
				return
			}
		}
	}()
}
