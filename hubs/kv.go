package hubs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strings"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/mesh"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/syncstream"
	"github.com/natsmesh/natsmesh/verdict"
)

// KVKind is the kind of the reference stateful hub: addresses "kv/<name>".
const KVKind = "kv"

// KV delivery types.
const (
	KVSet    = "set"    // payload "key=value"
	KVDelete = "delete" // payload "key"
	KVGet    = "get"    // payload "key"; the response is the value
)

// KVChange is the payload of a kv delta frame: Deleted, or Key set to Value.
type KVChange struct {
	Key     string `json:"key"`
	Value   string `json:"value,omitempty"`
	Deleted bool   `json:"deleted,omitempty"`
}

// NewKV returns the factory of the reference stateful hub: a map per
// address whose changes stream to subscribers on the destination-wide
// stream ("") — the snapshot is the whole map as a JSON object, each delta a
// KVChange. sender delivers the frames (the node's client).
//
// The map is durable state (DESIGN §7a, hub.LoadState): each set or delete
// is saved (compare-and-set) before it is applied, streamed and answered,
// so a request's response means the change is stored; a change that cannot
// be saved is not applied (over the state's size limit: Failed; fenced by a
// newer activation: not-the-owner, resendable). The stream's epoch is the
// state's takeover epoch and its version is stored with the map, so after a
// move (a crash, a drain, a restart) subscribers get the stored map as the
// next snapshot, at an (epoch, version) greater than anything before. On a
// node that keeps no durable state (hub.ErrNoStateStore: a standalone node)
// the map lives in memory and a new activation starts empty.
func NewKV(sender *mesh.Client, log *slog.Logger) hub.Factory {
	return func(ctx context.Context, addr subjects.Address) (hub.Hub, error) {
		h := &kvHub{data: map[string]string{}}
		h.owner = syncstream.NewOwner(sender, addr, func(subjects.Stream) []byte {
			b, _ := json.Marshal(h.data)
			return b
		}, log)
		st, err := hub.LoadState(ctx)
		switch {
		case errors.Is(err, hub.ErrNoStateStore):
			return h, nil // in memory only
		case err != nil:
			return nil, err
		}
		h.state = st
		var saved kvState
		if b := st.Data(); len(b) > 0 {
			if err := json.Unmarshal(b, &saved); err != nil {
				return nil, fmt.Errorf("kv: stored state of %s: %w", addr, err)
			}
		}
		if saved.Data != nil {
			h.data = saved.Data
		}
		h.owner.Resume(st.Epoch(), map[subjects.Stream]uint64{"": saved.Version})
		return h, nil
	}
}

// kvState is the kv hub's stored state: the map and the version of the
// stream's last change.
type kvState struct {
	Version uint64            `json:"version"`
	Data    map[string]string `json:"data"`
}

type kvHub struct {
	data  map[string]string // touched only on turns
	owner *syncstream.Owner
	state *hub.State // nil: in memory only
}

// save stores the map as it would be after the next change; nil state
// saves nothing.
func (h *kvHub) save(ctx context.Context) error {
	if h.state == nil {
		return nil
	}
	b, err := json.Marshal(kvState{Version: h.owner.Version("") + 1, Data: h.data})
	if err != nil {
		return err
	}
	return h.state.Save(ctx, b)
}

func (h *kvHub) Handle(ctx context.Context, d *hub.Delivery) error {
	if ok, err := h.owner.Handle(d); ok {
		return err
	}
	switch d.Type {
	case KVSet:
		k, v, ok := strings.Cut(string(d.Payload), "=")
		if !ok || k == "" {
			return verdict.New(verdict.ReasonBadRequest, `kv set wants "key=value"`)
		}
		old, had := h.data[k]
		h.data[k] = v
		if err := h.save(ctx); err != nil {
			if had {
				h.data[k] = old
			} else {
				delete(h.data, k)
			}
			return err
		}
		h.owner.Publish("", mustJSON(KVChange{Key: k, Value: v}))
		return d.Respond(nil)
	case KVDelete:
		k := string(d.Payload)
		if old, ok := h.data[k]; ok {
			delete(h.data, k)
			if err := h.save(ctx); err != nil {
				h.data[k] = old
				return err
			}
			h.owner.Publish("", mustJSON(KVChange{Key: k, Deleted: true}))
		}
		return d.Respond(nil)
	case KVGet:
		return d.Respond([]byte(h.data[string(d.Payload)]))
	}
	return verdict.New(verdict.ReasonBadRequest, "kv takes %s, %s or %s, not %q", KVSet, KVDelete, KVGet, d.Type)
}

// Pinned keeps the activation while it has subscribers.
func (h *kvHub) Pinned() bool { return h.owner.Pinned() }

// Deactivate tells subscribers to follow the next activation.
func (h *kvHub) Deactivate(context.Context) { h.owner.Close() }

// Snapshot returns a copy of the map (for tests).
func (h *kvHub) Snapshot() map[string]string { return maps.Clone(h.data) }

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}
