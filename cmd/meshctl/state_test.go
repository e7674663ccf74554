package main

import (
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/natsmesh/natsmesh/hubs"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/mesh"
)

// TestStateGet: meshctl state get prints the kv hub's stored map (table
// and -o json) with its owner, epoch and revision; no stored state, no
// node to read it and a bad address are errors with their exit codes.
func TestStateGet(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	if r := meshctl(t, s, "", "state", "get", "kv/none"); r.code != exitVerdict || !strings.Contains(r.stderr, "no natsmesh node") {
		t.Fatalf("before any node: %s", r)
	}
	nc := natstest.Connect(t, s)
	node, err := mesh.NewNode(mesh.NodeConfig{Conn: nc, Name: "n1", Logger: slog.New(slog.DiscardHandler),
		Membership: &mesh.MembershipConfig{Heartbeat: 100 * time.Millisecond, TTL: 400 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	if err := node.Register(hubs.KVKind, hubs.NewKV(node.Client, slog.New(slog.DiscardHandler))); err != nil {
		t.Fatal(err)
	}
	if err := node.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = node.Close() })
	for _, kv := range []string{"colour=blue", "size=9"} {
		if r := meshctl(t, s, "", "request", "kv/settings", "--type", "set", kv); r.code != 0 {
			t.Fatalf("set: %s", r)
		}
	}
	r := meshctl(t, s, "", "-o", "json", "state", "get", "kv/settings")
	wantCode(t, r, 0)
	var got stateRecord
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
		t.Fatalf("%v: %s", err, r.stdout)
	}
	if got.Address != "kv/settings" || got.Owner != node.ID().String() || got.Epoch != 1 || got.Revision == 0 || got.Value == nil || got.Updated.IsZero() {
		t.Fatalf("json: %+v", got)
	}
	var v struct {
		Version uint64            `json:"version"`
		Data    map[string]string `json:"data"`
	}
	if err := json.Unmarshal([]byte(*got.Value), &v); err != nil || v.Data["colour"] != "blue" || v.Data["size"] != "9" || v.Version != 2 {
		t.Fatalf("value %q: %v", *got.Value, err)
	}
	r = meshctl(t, s, "", "state", "get", "kv/settings")
	wantCode(t, r, 0)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "ADDRESS") || !strings.Contains(lines[1], node.ID().String()) || !strings.Contains(lines[1], `"colour":"blue"`) {
		t.Fatalf("table:\n%s", r.stdout)
	}
	wantCode(t, meshctl(t, s, "", "state", "get", "kv/other"), exitVerdict)
	wantCode(t, meshctl(t, s, "", "state", "get", string(make([]byte, 300))), exitUsage)
	wantCode(t, meshctl(t, s, "", "state", "get"), exitUsage)
}
