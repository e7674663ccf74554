package integration

import (
	"context"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/natsmesh/natsmesh/internal/meshtrace"
	"github.com/natsmesh/natsmesh/internal/nemesis"
)

// legRecorder is a span processor for the nemesis's sender: from each
// delivery's span it records the "attempt" events the sender adds, one a
// leg (mesh/trace.go), as nemesis legs — the sender's own account of what
// it sent and how each leg ended, which CheckTimeoutNotResent reads.
type legRecorder struct{ rec *nemesis.Recorder }

var idKey = meshtrace.MessageID("").Key

func (l legRecorder) OnStart(context.Context, sdktrace.ReadWriteSpan) {}

func (l legRecorder) OnEnd(s sdktrace.ReadOnlySpan) {
	id := ""
	for _, a := range s.Attributes() {
		if a.Key == idKey && a.Value.AsString() != "" {
			id = a.Value.AsString() // the last one set: the Receipt's
		}
	}
	if id == "" {
		return
	}
	for _, e := range s.Events() {
		if e.Name != "attempt" {
			continue
		}
		leg := nemesis.Leg{ID: id}
		for _, a := range e.Attributes {
			switch a.Key {
			case meshtrace.KeyAttempt:
				leg.Attempt = int(a.Value.AsInt64())
			case meshtrace.KeyNode:
				leg.Node = a.Value.AsString()
			case meshtrace.KeyVerdict:
				leg.Verdict = a.Value.AsString()
			case meshtrace.KeyReason:
				leg.Reason = a.Value.AsString()
			}
		}
		l.rec.AddLeg(leg)
	}
}

func (legRecorder) Shutdown(context.Context) error   { return nil }
func (legRecorder) ForceFlush(context.Context) error { return nil }
