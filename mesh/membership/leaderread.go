package membership

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// leaderEntry reads name's registry entry from the registry stream's leader
// ($JS.API.STREAM.MSG.GET with last_by_subj, which only the leader answers),
// not by a direct get that any replica may answer from before the latest
// writes. It returns the entry and its revision (0: absent or deleted). It
// blocks for one request, bounded by ctx and two seconds; while the stream
// elects a leader it fails.
func (m *Membership) leaderEntry(ctx context.Context, name string) (Member, uint64, error) {
	bucket := BucketName(m.cfg.Prefix)
	req, err := json.Marshal(struct {
		LastFor string `json:"last_by_subj"`
	}{"$KV." + bucket + "." + name})
	if err != nil {
		return Member{}, 0, err
	}
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	msg, err := m.cfg.Conn.RequestWithContext(rctx, "$JS.API.STREAM.MSG.GET.KV_"+bucket, req)
	if err != nil {
		return Member{}, 0, err
	}
	var resp struct {
		Error *jetstream.APIError `json:"error,omitempty"`
		Msg   *struct {
			Seq  uint64 `json:"seq"`
			Hdrs []byte `json:"hdrs,omitempty"`
			Data []byte `json:"data,omitempty"`
		} `json:"message,omitempty"`
	}
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return Member{}, 0, fmt.Errorf("membership: leader read of %s: %w", name, err)
	}
	switch {
	case resp.Error != nil && resp.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound:
		return Member{}, 0, nil
	case resp.Error != nil:
		return Member{}, 0, resp.Error
	case resp.Msg == nil || resp.Msg.Seq == 0:
		return Member{}, 0, fmt.Errorf("membership: leader read of %s: %w", name, jetstream.ErrInvalidJetStreamResponse)
	}
	if len(resp.Msg.Hdrs) > 0 {
		h, err := nats.DecodeHeadersMsg(resp.Msg.Hdrs)
		if err != nil {
			return Member{}, 0, fmt.Errorf("membership: leader read of %s: %w", name, err)
		}
		if op := h.Get("KV-Operation"); op == "DEL" || op == "PURGE" {
			return Member{}, 0, nil
		}
	}
	var v Member
	if err := json.Unmarshal(resp.Msg.Data, &v); err != nil || v.Node.Name != name {
		// Not a member of this name: as readEntry, the revision says the
		// entry is there; its content names no generation.
		return Member{}, resp.Msg.Seq, nil
	}
	return v, resp.Msg.Seq, nil
}
