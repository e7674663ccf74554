package integration

import (
	"errors"
	"io"
	"net"
	"sync"
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
}

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
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				return
			}
			return
		}
	}
}

// Cut cuts the link in mode until Restore.
func (p *Proxy) Cut(mode CutMode) {
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
