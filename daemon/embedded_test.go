package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func startEmbeddedForTest(t *testing.T) *server.Server {
	t.Helper()
	opts, err := EmbeddedOptions("127.0.0.1:0", t.TempDir(), "meshd-test")
	if err != nil {
		t.Fatal(err)
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(15 * time.Second) {
		ns.Shutdown()
		t.Fatal("embedded server not ready in 15s")
	}
	t.Cleanup(func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	})
	return ns
}

func TestEmbeddedOptions(t *testing.T) {
	t.Parallel()
	opts, err := EmbeddedOptions("127.0.0.1:0", t.TempDir(), "meshd-x")
	if err != nil {
		t.Fatal(err)
	}
	if opts.Port != server.RANDOM_PORT || opts.Host != "127.0.0.1" || !opts.JetStream || opts.ServerName != "meshd-x" ||
		opts.SystemAccount != EmbeddedSystemAccount || opts.NoAuthUser != "mesh" || !opts.NoSigs || !opts.NoLog ||
		opts.PingInterval != EmbeddedPingInterval || opts.MaxPingsOut != EmbeddedPingMax {
		t.Fatalf("unexpected options: %+v", opts)
	}
	if o, err := EmbeddedOptions(":4333", "d", "s"); err != nil || o.Host != "127.0.0.1" || o.Port != 4333 {
		t.Fatalf(":4333: %v %+v", err, o)
	}
	for _, bad := range []string{"nohostport", "127.0.0.1:x", "127.0.0.1:-3", "127.0.0.1:70000"} {
		if _, err := EmbeddedOptions(bad, "d", "s"); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%q: err %v, want ErrInvalidConfig", bad, err)
		}
	}
}

// TestEmbeddedDisconnectAdvisory: a client without credentials lands in MESH,
// sees the disconnect advisory of another MESH client on the imported
// subject, and has JetStream.
func TestEmbeddedDisconnectAdvisory(t *testing.T) {
	t.Parallel()
	ns := startEmbeddedForTest(t)
	url := ns.ClientURL()

	watcher, err := nats.Connect(url, nats.Name("natsmesh watcher.1"))
	if err != nil {
		t.Fatal(err)
	}
	defer watcher.Close()
	adv := make(chan *nats.Msg, 64)
	sub, err := watcher.ChanSubscribe(AdvisorySubjectEmbedded, adv)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := watcher.Flush(); err != nil {
		t.Fatal(err)
	}

	a, err := nats.Connect(url, nats.Name("natsmesh a.1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	aID, _ := a.GetClientID()
	closed := time.Now()
	a.Close()

	ev, received := waitDisconnect(t, adv, "natsmesh a.1", 10*time.Second)
	if ev.Type != server.DisconnectEventMsgType || ev.Client.Account != EmbeddedAccount || ev.Client.ID != aID {
		t.Fatalf("advisory: type %q account %q id %d (want %d)", ev.Type, ev.Client.Account, ev.Client.ID, aID)
	}
	t.Logf("embedded: disconnect advisory for %q (reason %q) %v after Close", ev.Client.Name, ev.Reason, received.Sub(closed))

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	js, err := jetstream.New(watcher)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "embedded_test", Storage: jetstream.MemoryStorage})
	if err != nil {
		t.Fatalf("JetStream in %s: %v", EmbeddedAccount, err)
	}
	if _, err := kv.Put(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(ctx, "k")
	if err != nil || string(e.Value()) != "v" {
		t.Fatalf("get: %v %v", e, err)
	}
	ai, err := js.AccountInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ai.Streams != 1 {
		t.Fatalf("account info: %d streams, want 1", ai.Streams)
	}
}

// waitDisconnect waits for the disconnect advisory of the client named name
// and returns it with the time it arrived.
func waitDisconnect(t *testing.T, ch <-chan *nats.Msg, name string, timeout time.Duration) (server.DisconnectEventMsg, time.Time) {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case m := <-ch:
			received := time.Now()
			var ev server.DisconnectEventMsg
			if err := json.Unmarshal(m.Data, &ev); err != nil {
				t.Fatalf("advisory %q: %v", m.Data, err)
			}
			if ev.Client.Name == name {
				return ev, received
			}
			t.Logf("ignoring disconnect advisory for %q", ev.Client.Name)
		case <-deadline:
			t.Fatalf("no disconnect advisory for %q within %v", name, timeout)
		}
	}
}

// TestEmbeddedDocs: the export and import lines that docs/operations.md and
// the EmbeddedOptions doc comment give operators are the embedded server's.
func TestEmbeddedDocs(t *testing.T) {
	t.Parallel()
	lines := []string{
		`exports: [{stream: "$SYS.ACCOUNT.MESH.DISCONNECT", accounts: [MESH]}]`,
		`imports: [{stream: {account: SYS, subject: "$SYS.ACCOUNT.MESH.DISCONNECT"}}]`,
	}
	doc, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("embedded.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range lines {
		if !strings.Contains(embeddedAccountsConf, l) {
			t.Errorf("embedded config lacks %s", l)
		}
		if !strings.Contains(string(doc), l) {
			t.Errorf("docs/operations.md lacks %s", l)
		}
		if apl := strings.ReplaceAll(l, "MESH", "APP"); !strings.Contains(string(src), "//\t"+apl) {
			t.Errorf("EmbeddedOptions doc comment lacks %s", apl)
		}
	}
}
