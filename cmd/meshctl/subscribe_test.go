package main

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/hubs"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/mesh"
	"github.com/natsmesh/natsmesh/mesh/membership"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/syncstream"
)

var quiet = slog.New(slog.DiscardHandler)

// fastMembership makes departures quick in tests.
func fastMembership() *mesh.MembershipConfig {
	return &mesh.MembershipConfig{Heartbeat: 100 * time.Millisecond, TTL: 400 * time.Millisecond, VerifyInterval: 100 * time.Millisecond}
}

// startOwner starts a node with membership hosting the kv kind (and any
// extra kinds) on s.
func startOwner(t *testing.T, s *server.Server, extra map[string]hub.Factory) *mesh.Node {
	t.Helper()
	nc := natstest.Connect(t, s)
	node, err := mesh.NewNode(mesh.NodeConfig{Conn: nc, Name: "owner", Membership: fastMembership(), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if err := node.Register(hubs.KVKind, hubs.NewKV(node.Client, quiet)); err != nil {
		t.Fatal(err)
	}
	for k, f := range extra {
		if err := node.Register(k, f); err != nil {
			t.Fatal(err)
		}
	}
	if err := node.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = node.Close() })
	return node
}

// running is a meshctl command running in a goroutine.
type running struct {
	out, errb natstest.SyncBuffer
	done      chan struct{}
	code      int
	cancel    context.CancelFunc
}

// start runs meshctl against s in the background; cancel is Ctrl-C.
func start(t *testing.T, s *server.Server, args ...string) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{done: make(chan struct{}), cancel: cancel}
	args = append([]string{"-s", s.ClientURL()}, args...)
	go func() {
		defer close(r.done)
		r.code = runIO(ctx, args, strings.NewReader(""), &r.out, &r.errb)
	}()
	t.Cleanup(func() {
		cancel()
		<-r.done
	})
	return r
}

// wait waits for the command to end and returns its result.
func (r *running) wait(t *testing.T) result {
	t.Helper()
	select {
	case <-r.done:
	case <-time.After(30 * time.Second):
		r.cancel()
		<-r.done
		t.Fatalf("meshctl did not end; stdout:\n%s\nstderr:\n%s", r.out.String(), r.errb.String())
	}
	return result{code: r.code, stdout: r.out.String(), stderr: r.errb.String()}
}

// waitLines polls until stdout holds n lines.
func (r *running) waitLines(t *testing.T, n int) {
	t.Helper()
	natstest.Eventually(t, 15*time.Second, func() bool {
		return strings.Count(r.out.String(), "\n") >= n
	}, "want %d lines of output; stdout %q, stderr %q", n, &r.out, &r.errb)
}

func kvSet(t *testing.T, n *mesh.Node, addr subjects.Address, kv string) {
	t.Helper()
	if _, err := n.Request(context.Background(), mesh.Delivery{To: addr, Type: hubs.KVSet, Payload: []byte(kv)}); err != nil {
		t.Fatalf("set %s on %s: %v", kv, addr, err)
	}
}

// meshctlNodes returns the members named meshctl-* that owner sees.
func meshctlNodes(owner *mesh.Node) []string {
	var out []string
	for _, m := range owner.Members().Members() {
		if strings.HasPrefix(m.Node.Name, "meshctl-") {
			out = append(out, m.Node.String())
		}
	}
	return out
}

var frameLine = regexp.MustCompile(`^epoch=(\d+) version=(\d+) (snapshot|delta) (.*)$`)

func TestSubscribeTable(t *testing.T) {
	s := natstest.RunServer(t)
	owner := startOwner(t, s, nil)
	r := start(t, s, "subscribe", "kv/x", "--count", "3")
	r.waitLines(t, 1) // the snapshot: the subscription is live
	natstest.Eventually(t, 5*time.Second, func() bool { return len(meshctlNodes(owner)) == 1 }, "meshctl node not seen by the owner")
	kvSet(t, owner, "kv/x", "a=1")
	kvSet(t, owner, "kv/x", "b=2")
	res := r.wait(t)
	wantCode(t, res, 0)
	lines := strings.Split(strings.TrimSuffix(res.stdout, "\n"), "\n")
	if len(lines) != 3 {
		t.Fatalf("want 3 lines, got %q", res.stdout)
	}
	var epoch string
	var version uint64
	for i, want := range []struct{ kind, data string }{
		{"snapshot", "{}"},
		{"delta", `{"key":"a","value":"1"}`},
		{"delta", `{"key":"b","value":"2"}`},
	} {
		m := frameLine.FindStringSubmatch(lines[i])
		if m == nil || m[3] != want.kind || m[4] != want.data {
			t.Fatalf("line %d: got %q, want %s %s", i, lines[i], want.kind, want.data)
		}
		v, _ := strconv.ParseUint(m[2], 10, 64)
		if i == 0 {
			epoch = m[1]
		} else if m[1] != epoch || v <= version {
			t.Fatalf("line %d: %q does not follow epoch %s version %d", i, lines[i], epoch, version)
		}
		version = v
	}
	if res.stderr != "" {
		t.Errorf("stderr %q", res.stderr)
	}
	// It left the mesh on its way out.
	natstest.Eventually(t, 5*time.Second, func() bool { return len(meshctlNodes(owner)) == 0 }, "meshctl node still a member: %v", meshctlNodes(owner))
}

func TestSubscribeJSON(t *testing.T) {
	s := natstest.RunServer(t)
	owner := startOwner(t, s, nil)
	kvSet(t, owner, "kv/j", "pre=0") // in the snapshot
	r := start(t, s, "subscribe", "kv/j", "--count", "3", "-o", "json")
	r.waitLines(t, 1)
	kvSet(t, owner, "kv/j", "a=1")
	kvSet(t, owner, "kv/j", "b=2")
	res := r.wait(t)
	wantCode(t, res, 0)
	lines := strings.Split(strings.TrimSuffix(res.stdout, "\n"), "\n")
	if len(lines) != 3 {
		t.Fatalf("want 3 JSON lines, got %q", res.stdout)
	}
	type frame struct {
		Epoch      uint64  `json:"epoch"`
		Version    uint64  `json:"version"`
		Snapshot   *bool   `json:"snapshot"`
		Data       *string `json:"data"`
		DataBase64 *string `json:"data_base64"`
	}
	var frames []frame
	for _, l := range lines {
		var f frame
		if err := json.Unmarshal([]byte(l), &f); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		if f.Snapshot == nil || f.Data == nil || f.DataBase64 != nil || f.Epoch == 0 {
			t.Fatalf("line %q: want epoch, snapshot and data", l)
		}
		frames = append(frames, f)
	}
	if !*frames[0].Snapshot || *frames[0].Data != `{"pre":"0"}` || frames[0].Version != 1 {
		t.Errorf("snapshot %q", lines[0])
	}
	for i, want := range []string{`{"key":"a","value":"1"}`, `{"key":"b","value":"2"}`} {
		f := frames[i+1]
		if *f.Snapshot || *f.Data != want || f.Epoch != frames[0].Epoch || f.Version != frames[i].Version+1 {
			t.Errorf("delta %d: %q, want data %s after %q", i, lines[i+1], want, lines[i])
		}
	}
}

func TestSubscribeInterrupted(t *testing.T) {
	s := natstest.RunServer(t)
	owner := startOwner(t, s, nil)
	r := start(t, s, "subscribe", "kv/i")
	r.waitLines(t, 1)
	kvSet(t, owner, "kv/i", "k=v")
	r.waitLines(t, 2)
	r.cancel() // Ctrl-C
	res := r.wait(t)
	wantCode(t, res, exitInterrupted)
	if !strings.Contains(res.stderr, "interrupted") || !strings.Contains(res.stdout, `delta {"key":"k","value":"v"}`) {
		t.Fatalf("got %s", res)
	}
	natstest.Eventually(t, 5*time.Second, func() bool { return len(meshctlNodes(owner)) == 0 }, "meshctl node still a member: %v", meshctlNodes(owner))
}

// TestSubscribeTornDown: a subscription the owner ends and then refuses is
// torn down: a one-line error and exit 3, after the frames it applied.
func TestSubscribeTornDown(t *testing.T) {
	s := natstest.RunServer(t)
	var refuse atomic.Bool
	var ownerSide atomic.Pointer[syncstream.Owner]
	var owner *mesh.Node
	owner = startOwner(t, s, map[string]hub.Factory{
		"flaky": func(_ context.Context, addr subjects.Address) (hub.Hub, error) {
			o := syncstream.NewOwner(owner.Client, addr, func(subjects.Stream) []byte { return []byte{0xff, 0x00} }, quiet)
			ownerSide.Store(o)
			return hub.HandlerFunc(func(_ context.Context, d *hub.Delivery) error {
				if d.Type == syncstream.TypeSubscribe && refuse.Load() {
					return errors.New("no more subscribers")
				}
				_, err := o.Handle(d)
				return err
			}), nil
		},
	})
	r := start(t, s, "subscribe", "flaky/x", "-o", "json")
	r.waitLines(t, 1)
	refuse.Store(true)
	ownerSide.Load().Close() // the subscriber comes back, and is refused
	res := r.wait(t)
	wantCode(t, res, exitVerdict)
	t.Logf("torn down: %s", res.stderr)
	if !strings.Contains(res.stderr, "torn down") || !strings.Contains(res.stderr, "no more subscribers") {
		t.Errorf("stderr %q", res.stderr)
	}
	// The snapshot was not UTF-8: base64.
	var f map[string]any
	if err := json.Unmarshal([]byte(res.stdout), &f); err != nil || f["data_base64"] != "/wA=" || f["snapshot"] != true {
		t.Errorf("stdout %q (%v)", res.stdout, err)
	}
	if _, ok := f["data"]; ok {
		t.Errorf("both data and data_base64: %q", res.stdout)
	}
}

func TestSubscribeUsageAndSetupErrors(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"bad address", []string{"subscribe", "noslash"}, "invalid address"},
		{"bad stream", []string{"subscribe", "kv/x", strings.Repeat("s", subjects.MaxStreamLen+1)}, "invalid stream"},
		{"bad count", []string{"subscribe", "kv/x", "--count", "-1"}, "--count"},
		{"missing address", []string{"subscribe"}, "--help"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := meshctl(t, s, "", tc.args...)
			wantCode(t, r, exitUsage)
			if !strings.Contains(r.stderr, tc.want) || r.stdout != "" {
				t.Fatalf("want %q on stderr, nothing on stdout; got %s", tc.want, r)
			}
		})
	}

	t.Run("no JetStream", func(t *testing.T) {
		r := meshctl(t, natstest.RunServer(t, natstest.WithoutJetStream()), "", "subscribe", "kv/x")
		wantCode(t, r, exitNoNATS)
		if !strings.Contains(r.stderr, "membership") || !strings.Contains(r.stderr, "JetStream") {
			t.Fatalf("stderr %q", r.stderr)
		}
	})
	t.Run("no membership on the prefix", func(t *testing.T) {
		r := meshctl(t, s, "", "subscribe", "kv/x")
		wantCode(t, r, exitVerdict)
		if !strings.Contains(r.stderr, "no mesh membership") {
			t.Fatalf("stderr %q", r.stderr)
		}
		// It created nothing.
		nc := natstest.Connect(t, s)
		js, _ := nc.JetStream()
		if _, err := js.KeyValue(membership.BucketName(subjects.DefaultPrefix)); err == nil {
			t.Fatal("subscribe created the registry bucket")
		}
	})
	t.Run("unreachable", func(t *testing.T) {
		r := meshctl(t, nil, "", "-s", "nats://127.0.0.1:1", "subscribe", "kv/x")
		wantCode(t, r, exitNoNATS)
	})
}

// TestSubscribeKeepsRegistryTTL: joining does not change the registry
// bucket the mesh configured (its TTL is the mesh's liveness contract).
func TestSubscribeKeepsRegistryTTL(t *testing.T) {
	s := natstest.RunServer(t)
	owner := startOwner(t, s, nil)
	r := start(t, s, "subscribe", "kv/t", "--count", "1")
	wantCode(t, r.wait(t), 0)
	nc := natstest.Connect(t, s)
	js, _ := jetstream.New(nc)
	kv, err := js.KeyValue(context.Background(), membership.BucketName(subjects.DefaultPrefix))
	if err != nil {
		t.Fatal(err)
	}
	st, err := kv.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if got := membership.RegistryTTL(st); got != fastMembership().TTL {
		t.Fatalf("registry TTL %v, want the mesh's %v", got, fastMembership().TTL)
	}
	if len(owner.Members().Members()) == 0 {
		t.Fatal("the owner lost its own registration")
	}
}

func TestSubscribeNoAnswer(t *testing.T) {
	s := natstest.RunServer(t)
	startOwner(t, s, nil)
	// No node hosts kind "nokind": placement keeps failing (resendable)
	// until --timeout.
	r := meshctl(t, s, "", "--timeout", "500ms", "subscribe", "nokind/x")
	wantCode(t, r, exitTimeout)
	t.Logf("no answer: %s", r.stderr)
	if !strings.Contains(r.stderr, "no answer") {
		t.Fatalf("stderr %q", r.stderr)
	}
}

// TestSubscriberShownApart: a running subscribe registers as a subscriber,
// which meshctl nodes counts apart from the mesh's nodes.
func TestSubscriberShownApart(t *testing.T) {
	s := natstest.RunServer(t)
	owner := startOwner(t, s, nil)
	r := start(t, s, "subscribe", "kv/apart")
	r.waitLines(t, 1)
	natstest.Eventually(t, 5*time.Second, func() bool { return len(meshctlNodes(owner)) == 1 }, "subscriber not registered")
	for _, m := range owner.Members().Members() {
		if want := strings.HasPrefix(m.Node.Name, "meshctl-"); m.Subscriber != want {
			t.Errorf("member %s: subscriber %v, want %v", m.Node, m.Subscriber, want)
		}
	}
	nodes := meshctl(t, s, "", "nodes")
	wantCode(t, nodes, 0)
	if !strings.Contains(nodes.stdout, "member (sees 1, +1 subscriber)") || strings.Contains(nodes.stdout, "meshctl-") {
		t.Errorf("nodes:\n%s", nodes.stdout)
	}
}

// TestUnknownKindAnswersQuickly: with membership, a kind no live node hosts
// is answered after the placement wait (not the whole ladder): exit 3, a
// verdict that says nothing was placed — within a --timeout of 5 s, where the
// ladder would have taken ≈10 s and ended in exit 4.
func TestUnknownKindAnswersQuickly(t *testing.T) {
	s := natstest.RunServer(t)
	startOwner(t, s, nil)
	r := meshctl(t, s, "", "--timeout", "5s", "send", "nope/x", "hello", "--id", "typo-1")
	wantCode(t, r, exitVerdict)
	for _, want := range []string{"Unavailable (no-placement)", `no live node hosts kind "nope"`, "nothing was placed", "typo-1"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("stderr %q lacks %q", r.stderr, want)
		}
	}
}
