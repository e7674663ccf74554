package membership

import (
	"testing"
	"time"

	"github.com/natsmesh/natsmesh/subjects"
)

// TestStaticView: the static view knows nobody, sees nothing gone, emits
// nothing and lets nothing be taken over.
func TestStaticView(t *testing.T) {
	t.Parallel()
	var v View = Static{}
	n := subjects.NodeID{Name: "a", Generation: 3}
	if v.Alive(n) || v.Gone(n) || v.Known(n) {
		t.Fatalf("static view: alive %v gone %v known %v, want none", v.Alive(n), v.Gone(n), v.Known(n))
	}
	if len(v.Members()) != 0 || len(v.Hosting("k")) != 0 || len(v.HostingNear("k", "c")) != 0 || !v.Self().Node.IsZero() {
		t.Fatal("static view knows members")
	}
	now := time.Now()
	if at := v.TakeoverAt(n); !at.After(now) {
		t.Fatalf("TakeoverAt %v: a takeover allowed", at)
	}
	if at := v.UnseenTakeoverAt(now.Add(-time.Hour)); !at.After(now) {
		t.Fatalf("UnseenTakeoverAt %v: a takeover allowed", at)
	}
	called := false
	cancel := v.OnEvent(func(Event) { called = true })
	cancel()
	if called {
		t.Fatal("static view emitted an event")
	}
}
