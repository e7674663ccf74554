package hubstate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/subjects"
)

// Get returns addr's stored record. Errors: ErrNotFound, ErrCorrupt, or
// JetStream's.
func (s *Store) Get(ctx context.Context, addr subjects.Address) (hub.StateRecord, error) {
	if err := addr.Validate(); err != nil {
		return hub.StateRecord{}, err
	}
	return get(ctx, s.kv, addr)
}

// Read returns addr's stored record from a bound state bucket (for tools
// that hold a jetstream.KeyValue, such as meshctl). Errors: ErrNotFound,
// ErrCorrupt, or JetStream's.
func Read(ctx context.Context, kv jetstream.KeyValue, addr subjects.Address) (hub.StateRecord, error) {
	return get(ctx, kv, addr)
}

func get(ctx context.Context, kv jetstream.KeyValue, addr subjects.Address) (hub.StateRecord, error) {
	e, err := kv.Get(ctx, Key(addr))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return hub.StateRecord{}, fmt.Errorf("%w for %s", ErrNotFound, addr)
	}
	if err != nil {
		return hub.StateRecord{}, err
	}
	r, err := Decode(e.Value())
	if err != nil {
		return hub.StateRecord{}, fmt.Errorf("state of %s: %w", addr, err)
	}
	r.Revision, r.Updated = e.Revision(), e.Created()
	return r, nil
}

// leaderGet reads addr's record from the bucket stream's leader (the
// JetStream message-get API), never from a direct get, which any replica
// may answer: a save's read-back must see what the leader stored, and a
// replica just back from a partition answers from before it (found by
// TestLeaseServerPartition: a read-back served by the healed server missed
// the save it settled). Errors: ErrNotFound (no record, or a deletion
// marker), ErrCorrupt, or the request's.
func (s *Store) leaderGet(ctx context.Context, addr subjects.Address) (hub.StateRecord, error) {
	req, err := json.Marshal(struct {
		LastFor string `json:"last_by_subj"`
	}{s.pre + Key(addr)})
	if err != nil {
		return hub.StateRecord{}, err
	}
	m, err := s.js.Conn().RequestWithContext(ctx, s.api+"STREAM.MSG.GET."+s.name, req)
	if err != nil {
		return hub.StateRecord{}, err
	}
	var resp struct {
		Error *jetstream.APIError `json:"error,omitempty"`
		Msg   *struct {
			Seq  uint64    `json:"seq"`
			Hdrs []byte    `json:"hdrs,omitempty"`
			Data []byte    `json:"data,omitempty"`
			Time time.Time `json:"time"`
		} `json:"message,omitempty"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return hub.StateRecord{}, fmt.Errorf("state of %s: message get: %w", addr, err)
	}
	switch {
	case resp.Error != nil && resp.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound:
		return hub.StateRecord{}, fmt.Errorf("%w for %s", ErrNotFound, addr)
	case resp.Error != nil:
		return hub.StateRecord{}, resp.Error
	case resp.Msg == nil:
		return hub.StateRecord{}, fmt.Errorf("state of %s: %w", addr, jetstream.ErrInvalidJetStreamResponse)
	}
	if len(resp.Msg.Hdrs) > 0 {
		h, err := nats.DecodeHeadersMsg(resp.Msg.Hdrs)
		if err != nil {
			return hub.StateRecord{}, fmt.Errorf("state of %s: %w", addr, err)
		}
		if op := h.Get(kvOperation); op == kvDelete || op == kvPurge {
			return hub.StateRecord{}, fmt.Errorf("%w for %s", ErrNotFound, addr)
		}
	}
	r, err := Decode(resp.Msg.Data)
	if err != nil {
		return hub.StateRecord{}, fmt.Errorf("state of %s: %w", addr, err)
	}
	r.Revision, r.Updated = resp.Msg.Seq, resp.Msg.Time
	return r, nil
}

// readBack reads addr's record from the leader (leaderGet) to settle a
// write, retrying while no leader answers (an election) until rctx ends.
// Errors: ErrNotFound, ErrCorrupt, or the last read's once rctx ended.
func (s *Store) readBack(rctx context.Context, addr subjects.Address) (hub.StateRecord, error) {
	for {
		cur, err := s.leaderGet(rctx, addr)
		if err == nil || errors.Is(err, ErrNotFound) || errors.Is(err, ErrCorrupt) || rctx.Err() != nil {
			return cur, err
		}
		s.pause(rctx)
	}
}
