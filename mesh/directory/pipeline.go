package directory

import (
	"context"
	"encoding/json"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/subjects"
)

// Pipelined claims (hub.PipelinedClaims, DESIGN §5 implementation notes).
// The plain case of a claim — no claim on the address at all — is one KV
// create: a JetStream publish to the key's subject with
// Nats-Expected-Last-Subject-Sequence 0, the header jetstream's
// KeyValue.Create sends. TryClaim publishes it with a reply subject of its
// own (a token under one wildcard inbox subscription) and returns; the
// server's acknowledgement settles it on that subscription's goroutine. So
// a storm of cold addresses costs no goroutine, response channel or
// request-map entry per claim, and the host's claim slots are refilled
// from the acknowledgements as they arrive.
//
// Anything but a clean acknowledgement — the server's "wrong last
// sequence" (the key exists, or a released claim's marker is there), no
// responders, a malformed acknowledgement, the context ending first, a
// publish error — settles with ok false, and the host runs Claim, which
// handles every other case (re-adopting a claim of its own, including one
// this publish wrote unseen; the live owner; a takeover after the fencing
// delay). A late acknowledgement of a settled claim is ignored.

// pipeline is the acknowledgement side of TryClaim.
type pipeline struct {
	once   sync.Once
	err    error  // the subscription could not be made: every TryClaim settles ok false
	prefix string // "<inbox>.": a claim's reply subject is prefix + its token
	sub    *nats.Subscription

	mu      sync.Mutex
	last    uint64               // the last token issued
	pending map[string]*tryClaim // token -> the claim awaiting its acknowledgement
}

// tryClaim is one pipelined claim in flight.
type tryClaim struct {
	addr subjects.Address
	done func(hub.Grant, bool)
	stop func() bool // stops the context's AfterFunc
}

// expectNone is the header of a KV create (jetstream.KeyValue.Create):
// the write lands only if the subject has no message at all.
var expectNone = nats.Header{jetstream.ExpectedLastSubjSeqHeader: []string{"0"}}

// pipe returns the pipeline, subscribing its inbox on first use.
func (d *Directory) pipe() *pipeline {
	p := &d.pipeline
	p.once.Do(func() {
		p.pending = map[string]*tryClaim{}
		p.prefix = d.cfg.Conn.NewInbox() + "."
		p.sub, p.err = d.cfg.Conn.Subscribe(p.prefix+"*", d.acked)
		if p.err == nil {
			// Acknowledgements are settled at once and never block; a
			// burst queues in the client rather than being dropped.
			_ = p.sub.SetPendingLimits(-1, -1)
		}
	})
	return p
}

// TryClaim starts the plain case of a claim of addr (hub.PipelinedClaims):
// a KV create of its claim naming this node, published without waiting.
// done is called once, on the pipeline's goroutine (or the one ending
// ctx): with the grant and its token when the create landed, else with ok
// false (see hub.PipelinedClaims). It does not block. Safe for concurrent
// use.
func (d *Directory) TryClaim(ctx context.Context, addr subjects.Address, done func(hub.Grant, bool)) {
	p := d.pipe()
	// A claim whose context ended (its host closed) writes nothing: its
	// caller's Claim fails on that context, and a create landing after
	// it would be a claim nobody holds or releases.
	if p.err != nil || d.ctx.Err() != nil || ctx.Err() != nil {
		go done(hub.Grant{}, false)
		return
	}
	b, _ := json.Marshal(Claim{Owner: d.self(), Claimed: time.Now().UTC()}) // real clock: written to the bucket
	c := &tryClaim{addr: addr, done: done}
	p.mu.Lock()
	p.last++
	tok := strconv.FormatUint(p.last, 36)
	p.pending[tok] = c
	// Under p.mu: c.stop is set before anything can read it (settle
	// takes p.mu first); the AfterFunc runs on a goroutine of its own.
	c.stop = context.AfterFunc(ctx, func() { d.settle(tok, 0) })
	p.mu.Unlock()
	err := d.cfg.Conn.PublishMsg(&nats.Msg{Subject: d.bucketSubj + key(addr), Reply: p.prefix + tok, Header: expectNone, Data: b})
	if err != nil {
		go d.settle(tok, 0)
	}
}

// pubAck is a JetStream publish acknowledgement, or its error.
type pubAck struct {
	Seq   uint64 `json:"seq"`
	Error *struct {
		Code    int `json:"code"`
		ErrCode int `json:"err_code"`
	} `json:"error"`
}

// acked settles the claim an acknowledgement names (the inbox
// subscription's callback).
func (d *Directory) acked(m *nats.Msg) {
	tok := m.Subject[len(d.pipeline.prefix):]
	var rev uint64
	if m.Header.Get("Status") == "" { // not no-responders (503)
		var a pubAck
		if err := json.Unmarshal(m.Data, &a); err == nil && a.Error == nil {
			rev = a.Seq
		}
	}
	d.settle(tok, rev)
}

// settle ends the pipelined claim tok, if it is still in flight: granted
// at rev, or (rev 0) not settled by the plain case.
func (d *Directory) settle(tok string, rev uint64) {
	p := &d.pipeline
	p.mu.Lock()
	c := p.pending[tok]
	delete(p.pending, tok)
	p.mu.Unlock()
	if c == nil {
		return // settled already: a late acknowledgement, or ctx ended first
	}
	c.stop()
	if rev == 0 {
		c.done(hub.Grant{}, false)
		return
	}
	c.done(d.own(c.addr, rev), true)
}

// closePipeline unsubscribes the pipeline and settles every claim in
// flight with ok false (the host's Claim then fails on the closed
// directory's context or completes it).
func (d *Directory) closePipeline() {
	p := &d.pipeline
	p.once.Do(func() { p.err = errClosed }) // never opened: stays closed
	if p.sub != nil {
		_ = p.sub.Unsubscribe()
	}
	p.mu.Lock()
	toks := make([]string, 0, len(p.pending))
	for tok := range p.pending {
		toks = append(toks, tok)
	}
	p.mu.Unlock()
	for _, tok := range toks {
		d.settle(tok, 0)
	}
}
