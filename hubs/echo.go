// Package hubs holds the hub kinds built into meshd, which make a mesh useful
// without writing Go.
package hubs

import (
	"context"
	"log/slog"
	"slices"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/mesh"
	"github.com/natsmesh/natsmesh/subjects"
)

// EchoKind is the kind of the echo hub: addresses "echo/<anything>".
const EchoKind = "echo"

// Echo builds an echo hub: a request is answered with its own payload; a
// plain delivery is accepted and dropped. It keeps no state, so every
// address of the kind costs only its activation.
func Echo(context.Context, subjects.Address) (hub.Hub, error) {
	return hub.HandlerFunc(func(_ context.Context, d *hub.Delivery) error {
		return d.Respond(d.Payload)
	}), nil
}

// Builtin returns the built-in hub kinds by kind name; sender is the node's
// client (the kv hub sends its sync-stream frames with it).
func Builtin(sender *mesh.Client, log *slog.Logger) map[string]hub.Factory {
	return map[string]hub.Factory{EchoKind: Echo, KVKind: NewKV(sender, log)}
}

// Names returns the built-in kinds, sorted.
func Names() []string {
	names := []string{EchoKind, KVKind}
	slices.Sort(names)
	return names
}
