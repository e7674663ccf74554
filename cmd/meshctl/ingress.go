package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// This file is a candidate for a library package: delivering through the
// ingress needs no mesh.Client, only a NATS connection.

// ingressDelivery is one delivery sent through the ingress.
type ingressDelivery struct {
	To      subjects.Address
	Stream  subjects.Stream
	ID      string // empty: a fresh NUID
	Type    string
	Payload []byte
	// ExpectResponse asks for the handler's response as the reply payload.
	ExpectResponse bool
}

// ingressAnswer is the mesh's answer to an ingress delivery.
type ingressAnswer struct {
	ID      string // the delivery ID (the reply's Mesh-Id, else the one sent)
	Node    string // the answering node ("name.gen"), if named
	Err     error  // nil for Accepted, else the decoded *verdict.Error
	Payload []byte // the handler's response, for ExpectResponse
}

// Errors of deliverIngress that are not verdicts.
var (
	// errNoIngress: no node serves the ingress of the prefix (no
	// responders); nothing was delivered, so it is safe to send again.
	errNoIngress = errors.New("no mesh node serves the ingress")
	// errIngressTimeout: no answer in time; the mesh may hold the
	// delivery, so it may only be re-sent under the same ID.
	errIngressTimeout = errors.New("no answer from the ingress in time")
)

// validate checks d as the mesh would and fills in its ID. Errors match
// verdict.ErrInvalidAddress or verdict.ErrBadRequest.
func (d *ingressDelivery) validate() error {
	if d.ID == "" {
		d.ID = nuid.Next()
	}
	if len(d.ID) > hub.MaxIDLen {
		return verdict.New(verdict.ReasonBadRequest, "delivery ID of %d bytes is over %d", len(d.ID), hub.MaxIDLen)
	}
	if err := d.To.Validate(); err != nil {
		return &verdict.Error{Reason: verdict.ReasonInvalidAddress, Message: "address: " + err.Error(), Err: err}
	}
	if err := d.Stream.Validate(); err != nil {
		return &verdict.Error{Reason: verdict.ReasonInvalidAddress, Message: "stream: " + err.Error(), Err: err}
	}
	if len(d.Type) > hub.MaxTypeLen {
		return verdict.New(verdict.ReasonBadRequest, "type of %d bytes is over %d", len(d.Type), hub.MaxTypeLen)
	}
	return nil
}

// message builds the ingress request for d under prefix.
func (d *ingressDelivery) message(prefix subjects.Prefix) *nats.Msg {
	m := &nats.Msg{Subject: prefix.Ingress(d.To, d.Stream), Header: nats.Header{}, Data: d.Payload}
	m.Header.Set(hub.HeaderID, d.ID)
	if d.Type != "" {
		m.Header.Set(hub.HeaderType, d.Type)
	}
	if d.ExpectResponse {
		m.Header.Set(hub.HeaderExpectResponse, "true")
	}
	return m
}

// msgSize is the size nats.go checks against max_payload: payload plus the
// encoded headers.
func msgSize(m *nats.Msg) int {
	n := len(m.Data)
	if len(m.Header) > 0 {
		n += len("NATS/1.0\r\n\r\n")
		for k, vs := range m.Header {
			for _, v := range vs {
				n += len(k) + len(": ") + len(v) + len("\r\n")
			}
		}
	}
	return n
}

// noIngressWait is how long a request meeting no responders on the
// ingress is re-sent before meshctl says no node serves it: during a
// rolling restart of the NATS servers the nodes' queue subscriptions are
// missing from a server for a moment (nothing was delivered, so the re-send
// is safe), while with no node at all the answer still comes in about a
// second.
const noIngressWait = time.Second

// requestIngress sends m and waits for its reply within ctx, re-sending it
// (backing off from 50 ms, doubling, to 400 ms) while it meets no
// responders, for up to noIngressWait.
func requestIngress(ctx context.Context, nc *nats.Conn, m *nats.Msg) (*nats.Msg, error) {
	end := time.Now().Add(noIngressWait)
	wait := 50 * time.Millisecond
	for {
		reply, err := nc.RequestMsgWithContext(ctx, m)
		if !errors.Is(err, nats.ErrNoResponders) || !time.Now().Add(wait).Before(end) {
			return reply, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(wait):
		}
		wait = min(2*wait, 400*time.Millisecond)
	}
}

// deliverIngress sends d through the ingress of prefix and waits for its
// verdict (and, with ExpectResponse, the handler's response) for at most
// timeout. The returned error is for what is not a verdict: invalid input
// (verdict.ErrInvalidAddress, verdict.ErrBadRequest), a payload over the server's max_payload
// (verdict.ErrPayloadTooLarge; both before anything is sent), no node
// serving the ingress for noIngressWait (errNoIngress), no answer in time (errIngressTimeout),
// or the connection's error. A verdict, Accepted or not, is in the answer.
func deliverIngress(ctx context.Context, nc *nats.Conn, prefix subjects.Prefix, d ingressDelivery, timeout time.Duration) (ingressAnswer, error) {
	if err := d.validate(); err != nil {
		return ingressAnswer{ID: d.ID}, err
	}
	m := d.message(prefix)
	if max := nc.MaxPayload(); max > 0 && int64(msgSize(m)) > max {
		return ingressAnswer{ID: d.ID}, verdict.New(verdict.ReasonPayloadTooLarge,
			"payload of %d bytes (%d with headers) is over the server's max_payload of %d", len(d.Payload), msgSize(m), max)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	reply, err := requestIngress(ctx, nc, m)
	switch {
	case err == nil:
	case errors.Is(err, nats.ErrNoResponders):
		return ingressAnswer{ID: d.ID}, fmt.Errorf("%w (%s)", errNoIngress, prefix.IngressSubscription())
	case errors.Is(err, nats.ErrMaxPayload):
		return ingressAnswer{ID: d.ID}, verdict.New(verdict.ReasonPayloadTooLarge,
			"payload of %d bytes (%d with headers) is over the server's max_payload of %d", len(d.Payload), msgSize(m), nc.MaxPayload())
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout):
		return ingressAnswer{ID: d.ID}, errIngressTimeout
	default:
		return ingressAnswer{ID: d.ID}, err
	}
	a := ingressAnswer{ID: d.ID}
	if id := reply.Header.Get(hub.HeaderID); id != "" {
		a.ID = id
	}
	a.Node, a.Err = verdict.Decode(reply.Header)
	if d.ExpectResponse && a.Err == nil {
		a.Payload = reply.Data
	}
	return a, nil
}
