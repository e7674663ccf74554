// Package hubs holds the hub kinds built into meshd, which make a mesh useful
// without writing Go.
package hubs

import (
	"context"
	"slices"

	"github.com/natsmesh/natsmesh/hub"
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

// Builtin returns the built-in hub kinds by kind name.
func Builtin() map[string]hub.Factory {
	return map[string]hub.Factory{EchoKind: Echo}
}

// Names returns the built-in kinds, sorted.
func Names() []string {
	names := make([]string, 0, 1)
	for k := range Builtin() {
		names = append(names, k)
	}
	slices.Sort(names)
	return names
}
