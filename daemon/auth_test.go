package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/mesh"
	"github.com/natsmesh/natsmesh/mesh/membership"
	"github.com/natsmesh/natsmesh/profiles"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// meshd --auth: the seeds are generated 0600 in a 0700 directory and kept
// across restarts; a client without a key is refused; the client seed
// reaches the ingress and nothing else; the node serves with the node seed.
func TestRunWithAuth(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	var first AuthKeys
	for round := range 2 {
		ctx, cancel := context.WithCancel(context.Background())
		infoCh := make(chan Info, 1)
		done := make(chan error, 1)
		go func() {
			done <- Run(ctx, Config{
				Name: "authed", Listen: "127.0.0.1:0", DataDir: dir, Auth: true, HTTP: "127.0.0.1:0",
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
				Ready:  func(i Info) { infoCh <- i },
			})
		}()
		var info Info
		select {
		case info = <-infoCh:
		case err := <-done:
			t.Fatalf("run: %v", err)
		case <-time.After(30 * time.Second):
			t.Fatal("node not ready")
		}
		keys, err := EnsureAuthKeys(filepath.Join(dir, AuthDirName))
		if err != nil {
			t.Fatal(err)
		}
		if round == 0 {
			first = keys
		} else if keys != first {
			t.Fatalf("keys changed across restarts: %+v then %+v", first, keys)
		}
		if st, err := os.Stat(keys.Dir); err != nil || st.Mode().Perm() != 0o700 {
			t.Fatalf("auth dir mode: %v %v", st.Mode(), err)
		}
		for _, f := range []string{NodeSeedFile, ClientSeedFile, OperatorSeedFile} {
			if st, err := os.Stat(filepath.Join(keys.Dir, f)); err != nil || st.Mode().Perm() != 0o600 {
				t.Fatalf("%s mode: %v %v", f, st.Mode(), err)
			}
		}
		url := info.NATSURL
		if _, err := nats.Connect(url); err == nil || !strings.Contains(strings.ToLower(err.Error()), "authorization") {
			t.Fatalf("a client without a key connected: %v", err)
		}
		opt, err := nats.NkeyOptionFromSeed(filepath.Join(keys.Dir, ClientSeedFile))
		if err != nil {
			t.Fatal(err)
		}
		violations := make(chan error, 4)
		cl := natstest.ConnectURL(t, url, opt, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { violations <- err }))
		m := &nats.Msg{Subject: subjects.DefaultPrefix.Ingress("echo/x", ""), Header: nats.Header{}, Data: []byte("hi")}
		m.Header.Set(hub.HeaderID, "auth-1")
		m.Header.Set(hub.HeaderExpectResponse, "true")
		r, err := cl.RequestMsg(m, 10*time.Second)
		if err != nil {
			t.Fatalf("ingress as client: %v", err)
		}
		if _, verr := verdict.Decode(r.Header); verr != nil || string(r.Data) != "hi" {
			t.Fatalf("ingress answer %q %v", r.Data, verr)
		}
		if err := cl.Publish("$KV.natsmesh_mesh_v1_nodes.authed", []byte("{}")); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-violations:
			if !errors.Is(err, nats.ErrPermissionViolation) {
				t.Fatalf("async error %v, want a permission violation", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a registry write by the client profile was not refused")
		}
		// A reply subject aimed at the registry never reaches the mesh
		// account: the caller account's request crosses the service
		// import, whose reply the server makes (_R_.…), so the node
		// answers there and its answer goes back into CALLERS, which has
		// no JetStream; nothing is refused because nothing needs to be.
		refl := &nats.Msg{Subject: subjects.DefaultPrefix.Ingress("echo/x", ""), Reply: "$KV.natsmesh_mesh_v1_nodes.authed", Header: nats.Header{}, Data: []byte("{}")}
		refl.Header.Set(hub.HeaderID, "auth-reflect")
		refl.Header.Set(hub.HeaderExpectResponse, "true")
		if err := cl.PublishMsg(refl); err != nil {
			t.Fatal(err)
		}
		nopt, err := nats.NkeyOptionFromSeed(keys.NodeSeed())
		if err != nil {
			t.Fatal(err)
		}
		nd := natstest.ConnectURL(t, url, nopt, nats.CustomInboxPrefix(profiles.NodeInboxPrefix(subjects.DefaultPrefix)))
		js, err := jetstream.New(nd)
		if err != nil {
			t.Fatal(err)
		}
		kctx, kcancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer kcancel()
		reg, err := js.KeyValue(kctx, membership.BucketName(subjects.DefaultPrefix))
		if err != nil {
			t.Fatal(err)
		}
		// The same ID again, answered to the caller's inbox: once it is
		// answered the node has taken both (the first is deduped against
		// this one or this against the first), and the first's answer
		// has gone out.
		again := &nats.Msg{Subject: refl.Subject, Header: refl.Header, Data: refl.Data}
		if _, err := cl.RequestMsg(again, 10*time.Second); err != nil {
			t.Fatalf("the same ID again: %v", err)
		}
		natstest.Eventually(t, 10*time.Second, func() bool {
			r, err := nd.Request(subjects.DefaultPrefix.Control("authed", mesh.ControlPing), nil, 5*time.Second)
			var st mesh.NodeStatus
			return err == nil && json.Unmarshal(r.Data, &st) == nil && st.Ingress >= 3
		}, "the node did not take the three ingress requests")
		e, err := reg.Get(kctx, "authed")
		if err != nil {
			t.Fatal(err)
		}
		var mb membership.Member
		if err := json.Unmarshal(e.Value(), &mb); err != nil || mb.Node.Name != "authed" {
			t.Fatalf("the node's registry entry was overwritten through the ingress: %s", e.Value())
		}
		// The security counters are exported.
		natstest.Eventually(t, 10*time.Second, func() bool {
			_, b := scrape(t, info.HTTPAddr, "")
			body := string(b)
			return strings.Contains(body, "natsmesh_ingress_refused_total 0") &&
				strings.Contains(body, "natsmesh_forged_answers_total 0") &&
				strings.Contains(body, `natsmesh_kv_invalid_entries_total{bucket="registry"} 0`) &&
				strings.Contains(body, `natsmesh_kv_own_entry_overwritten_total{bucket="directory"} 0`)
		}, "security metrics")
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("drain: %v", err)
		}
	}
}

func TestListenBeyondLoopbackNeedsAuth(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg Config
		ok  bool
	}{
		{Config{Name: "n", Listen: "127.0.0.1:4222"}, true},
		{Config{Name: "n", Listen: "[::1]:4222"}, true},
		{Config{Name: "n", Listen: "localhost:4222"}, true},
		{Config{Name: "n", Listen: "0.0.0.0:4222"}, false},
		{Config{Name: "n", Listen: ":4222"}, false},
		{Config{Name: "n", Listen: "10.1.2.3:4222"}, false},
		{Config{Name: "n", Listen: "0.0.0.0:4222", Auth: true}, true},
		{Config{Name: "n", Listen: "0.0.0.0:4222", InsecureListen: true}, true},
		{Config{Name: "n", Listen: "0.0.0.0:4222", NATSURL: "nats://x:4222"}, true}, // no embedded server
		{Config{Name: "n", NATSURL: "nats://x:4222", Auth: true}, false},
	} {
		err := tc.cfg.validate()
		if tc.ok != (err == nil) || (err != nil && !errors.Is(err, ErrInvalidConfig)) {
			t.Errorf("%+v: %v", tc.cfg, err)
		}
	}
	err := (&Config{Name: "n", Listen: "0.0.0.0:4222"}).validate()
	if err == nil || !strings.Contains(err.Error(), "refusing to listen on 0.0.0.0:4222 without auth") {
		t.Fatalf("error %v", err)
	}
}

func TestAuthKeysRefuseLooseFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if _, err := EnsureAuthKeys(dir); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, ClientSeedFile)
	if err := os.Chmod(p, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := EnsureAuthKeys(dir); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("a world-readable seed: %v", err)
	}
	if err := os.WriteFile(p, []byte("not a seed\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := EnsureAuthKeys(dir); err == nil {
		t.Fatal("a bad seed was accepted")
	}
}

// TestNegativeSettingNamed: a negative setting is refused naming that one
// setting and its flag (a fresh-user trial met one message listing eight).
func TestNegativeSettingNamed(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Name: "n", DrainTimeout: -time.Second}, "DrainTimeout (--drain-timeout) is negative"},
		{Config{Name: "n", KVReplicas: -1}, "KVReplicas (--kv-replicas) is negative"},
		{Config{Name: "n", TTL: -1}, "TTL (--ttl) is negative"},
		{Config{Name: "n", StateMaxValueSize: -1}, "StateMaxValueSize (--state-max-value) is negative"},
	} {
		err := tc.cfg.validate()
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.cfg, err, tc.want)
		}
	}
}

// TestMalformedNATSURL: a malformed NATSURL is an invalid config, found
// before anything is dialed.
func TestMalformedNATSURL(t *testing.T) {
	t.Parallel()
	for _, u := range []string{"nats//127.0.0.1::4222", "nats://127.0.0.1::4222", "http://x", " "} {
		cfg := Config{Name: "n", NATSURL: u}
		if err := cfg.validate(); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "NATSURL") {
			t.Errorf("NATSURL %q: %v, want ErrInvalidConfig naming NATSURL", u, err)
		}
	}
	cfg := Config{Name: "n", NATSURL: "nats://nats-1:4222, nats://nats-2:4222"}
	if err := cfg.validate(); err != nil {
		t.Errorf("a well-formed list: %v", err)
	}
}
