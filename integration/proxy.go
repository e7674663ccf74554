package integration

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// CutMode says how a Proxy cuts its link.
type CutMode int

const (
	// CutClose closes every proxied connection (both sides see the close
	// at once) and refuses new ones until Restore.
	CutClose CutMode = iota + 1
	// CutDrop stops forwarding silently: connections stay open, bytes
	// stay unread (as on a partitioned network), until Restore or until an
	// end gives up on the other and closes.
	CutDrop
)

// Proxy is a TCP proxy on loopback in front of one address, whose link a
// test can cut (closed, or silently dropped) and restore.
type Proxy struct {
	Addr   string // host:port to connect to instead of the target
	target string
	ln     net.Listener

	mu     sync.Mutex
	cut    CutMode // 0: forwarding
	resume chan struct{}
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup

	// lastForward is when a pump last wrote bytes on (Unix ns): a link the
	// proxy stopped moving before it was cut (its goroutines starved on a
	// loaded machine) was in effect cut from then on.
	lastForward atomic.Int64
	// delay is how long each chunk read is held before it is written on
	// (ns; 0: none): a slow link (SetDelay).
	delay atomic.Int64
}

// SetDelay makes the link slow: every chunk a pump reads is written on d
// after it was read, until SetDelay(0). A pump reads its next chunk only
// after writing the last, so a slow link also moves at most one read
// (32 KiB) per d each way — latency and a bandwidth bound, as a congested
// or distant link has; order is kept.
func (p *Proxy) SetDelay(d time.Duration) { p.delay.Store(int64(d)) }

// StartProxy listens on a free loopback port and forwards each connection
// to target. It stops with the test.
func StartProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{Addr: ln.Addr().String(), target: target, ln: ln, resume: make(chan struct{}), conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

// Connected reports whether a connection through the proxy is open: for a
// node's proxy to one server, whether the node is connected to that server.
func (p *Proxy) Connected() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns) > 0
}

// URL is the proxy's NATS URL.
func (p *Proxy) URL() string { return "nats://" + p.Addr }

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.closed || p.cut == CutClose {
			p.mu.Unlock()
			c.Close()
			continue
		}
		p.mu.Unlock()
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

// pump copies src to dst, holding bytes back while the link is dropped.
func (p *Proxy) pump(src, dst net.Conn) {
	defer p.wg.Done()
	defer func() {
		src.Close()
		dst.Close()
		p.mu.Lock()
		delete(p.conns, src)
		delete(p.conns, dst)
		p.mu.Unlock()
	}()
	buf := make([]byte, 32<<10)
	for {
		p.mu.Lock()
		cut, resume := p.cut, p.resume
		p.mu.Unlock()
		if cut == CutDrop {
			<-resume // read nothing: the sender's bytes stay in flight
			continue
		}
		n, err := src.Read(buf)
		if n > 0 {
			if d := time.Duration(p.delay.Load()); d > 0 {
				time.Sleep(d)
			}
			p.mu.Lock()
			cut = p.cut
			resume = p.resume
			p.mu.Unlock()
			if cut == CutDrop {
				<-resume // the link went down with these bytes in flight
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
			p.lastForward.Store(time.Now().UnixNano())
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				return
			}
			return
		}
	}
}

// Cut cuts the link in mode until Restore. It returns when the link in
// effect stopped: now, or — when the proxy had moved no bytes for a while
// before (its goroutines starved on a loaded machine, with traffic
// waiting) — the last time it forwarded any; a checker's partition window
// starts there.
func (p *Proxy) Cut(mode CutMode) time.Time {
	now := time.Now()
	stopped := now
	if last := p.lastForward.Load(); last != 0 && time.Unix(0, last).Before(now) {
		stopped = time.Unix(0, last)
	}
	p.mu.Lock()
	p.cut = mode
	var conns []net.Conn
	if mode == CutClose {
		for c := range p.conns {
			conns = append(conns, c)
		}
	}
	p.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
	return stopped
}

// Restore forwards again (new connections; after CutDrop, also the held
// ones that both ends kept).
func (p *Proxy) Restore() {
	p.mu.Lock()
	p.cut = 0
	close(p.resume)
	p.resume = make(chan struct{})
	p.mu.Unlock()
}

// Close stops the proxy and every connection.
func (p *Proxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	p.cut = 0
	close(p.resume)
	p.resume = make(chan struct{})
	conns := make([]net.Conn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	p.ln.Close()
	for _, c := range conns {
		c.Close()
	}
	p.wg.Wait()
}
