package hubs

import (
	"context"
	"encoding/json"
	"log/slog"
	"maps"
	"strings"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/mesh"
	"github.com/natsmesh/natsmesh/mesh/syncstream"
	"github.com/natsmesh/natsmesh/subjects"
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

// NewKV returns the factory of the reference stateful hub: an in-memory map
// per address whose changes stream to subscribers on the destination-wide
// stream ("") — the snapshot is the whole map as a JSON object, each delta a
// KVChange. sender delivers the frames (the node's client).
func NewKV(sender *mesh.Client, log *slog.Logger) hub.Factory {
	return func(_ context.Context, addr subjects.Address) (hub.Hub, error) {
		h := &kvHub{data: map[string]string{}}
		h.owner = syncstream.NewOwner(sender, addr, func(subjects.Stream) []byte {
			b, _ := json.Marshal(h.data)
			return b
		}, log)
		return h, nil
	}
}

type kvHub struct {
	data  map[string]string // touched only on turns
	owner *syncstream.Owner
}

func (h *kvHub) Handle(_ context.Context, d *hub.Delivery) error {
	if ok, err := h.owner.Handle(d); ok {
		return err
	}
	switch d.Type {
	case KVSet:
		k, v, ok := strings.Cut(string(d.Payload), "=")
		if !ok || k == "" {
			return verdict.New(verdict.ReasonBadRequest, `kv set wants "key=value"`)
		}
		h.data[k] = v
		h.owner.Publish("", mustJSON(KVChange{Key: k, Value: v}))
		return d.Respond(nil)
	case KVDelete:
		k := string(d.Payload)
		if _, ok := h.data[k]; ok {
			delete(h.data, k)
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
