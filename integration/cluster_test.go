package integration

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsmesh/natsmesh/internal/natstest"
)

const helperClientArg = "natsmesh-helper-client"

// TestClusterHelperClient is not a test: run as a child process of this
// test binary with the arguments `-- natsmesh-helper-client URL NAME`, it
// connects to URL as NAME, prints "ready" and waits to be killed or frozen.
func TestClusterHelperClient(t *testing.T) {
	args := flag.Args()
	if len(args) != 3 || args[0] != helperClientArg {
		t.Skip("helper process for the cluster tests")
	}
	nc, err := nats.Connect(args[1], nats.Name(args[2]), nats.NoReconnect())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if err := nc.Flush(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	fmt.Println("ready")
	select {}
}

// startHelperClient runs a client process connected to url as name.
func startHelperClient(t *testing.T, url, name string) *Process {
	t.Helper()
	p := Start(t, os.Args[0], "-test.run=^TestClusterHelperClient$", "--", helperClientArg, url, name)
	p.WaitLine(t, regexp.MustCompile(`^ready$`), 15*time.Second)
	return p
}

func connect(t *testing.T, url, name string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, nats.Name(name), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// waitAdvisory waits for the disconnect advisory of the client named name.
func waitAdvisory(t *testing.T, ch <-chan *nats.Msg, name string, timeout time.Duration) (server.DisconnectEventMsg, time.Time) {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case m := <-ch:
			at := time.Now()
			var ev server.DisconnectEventMsg
			if err := json.Unmarshal(m.Data, &ev); err != nil {
				t.Fatalf("advisory %q: %v", m.Data, err)
			}
			if ev.Client.Name == name {
				return ev, at
			}
			t.Logf("ignoring disconnect advisory for %q", ev.Client.Name)
		case <-deadline:
			t.Fatalf("no disconnect advisory for %q within %v", name, timeout)
		}
	}
}

// TestCluster: a three-server cluster with the documented accounts; an R3
// memory KV bucket written through one server and read through another;
// disconnect advisories across servers for a SIGKILLed and a frozen client;
// the bucket's stream leader killed and the bucket still usable from a
// survivor; the killed server restarted and caught up.
func TestCluster(t *testing.T) {
	longTest(t)
	start := time.Now()
	c := StartCluster(t, 3)
	c.WaitReady(t)
	t.Logf("cluster ready in %v", time.Since(start))

	nc0 := connect(t, c.Server(0).URL, "natsmesh test0.1")
	nc1 := connect(t, c.Server(1).URL, "natsmesh test1.1")
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()

	// KV: R3 memory bucket, written on server 0, read on server 1.
	js0, err := jetstream.New(nc0)
	if err != nil {
		t.Fatal(err)
	}
	js1, err := jetstream.New(nc1)
	if err != nil {
		t.Fatal(err)
	}
	kv0, err := js0.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "cluster_test", Storage: jetstream.MemoryStorage, Replicas: 3})
	if err != nil {
		t.Fatalf("create R3 memory bucket: %v", err)
	}
	if _, err := kv0.Put(ctx, "k", []byte("v1")); err != nil {
		t.Fatal(err)
	}
	kv1, err := js1.KeyValue(ctx, "cluster_test")
	if err != nil {
		t.Fatal(err)
	}
	if e, err := kv1.Get(ctx, "k"); err != nil || string(e.Value()) != "v1" {
		t.Fatalf("get on server 1: %v %v", e, err)
	}

	// Disconnect advisories: the watcher is on server 0, the clients on
	// servers 2 and 1.
	adv := make(chan *nats.Msg, 64)
	sub, err := nc0.ChanSubscribe(ClusterAdvisorySubject, adv)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc0.Flush(); err != nil {
		t.Fatal(err)
	}
	// The subscription's interest reaches the other servers over the routes
	// asynchronously: probe until an advisory from each of them arrives.
	waitAdvisoryRoute(t, c, 2, adv)
	waitAdvisoryRoute(t, c, 1, adv)

	victim := startHelperClient(t, c.Server(2).URL, "natsmesh victim.7")
	killed := time.Now()
	if err := victim.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	ev, at := waitAdvisory(t, adv, "natsmesh victim.7", 10*time.Second)
	if ev.Client.Account != "MESH" || ev.Server.Name != c.Server(2).Name {
		t.Fatalf("advisory: account %q server %q", ev.Client.Account, ev.Server.Name)
	}
	t.Logf("cross-server: advisory for SIGKILLed client on %s seen on %s %v after SIGKILL (reason %q)", ev.Server.Name, c.Server(0).Name, at.Sub(killed), ev.Reason)

	frozen := startHelperClient(t, c.Server(1).URL, "natsmesh frozen.3")
	stopped := time.Now()
	if err := frozen.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	ev, at = waitAdvisory(t, adv, "natsmesh frozen.3", 10*time.Second)
	t.Logf("cross-server: advisory for SIGSTOPped client on %s seen on %s %v after SIGSTOP (reason %q)", ev.Server.Name, c.Server(0).Name, at.Sub(stopped), ev.Reason)
	_ = frozen.Signal(syscall.SIGKILL)

	// Kill the bucket's stream leader; the bucket keeps working through a
	// connection to a survivor once a new leader is elected.
	si, err := js0.Stream(ctx, "KV_cluster_test")
	if err != nil {
		t.Fatal(err)
	}
	leader := c.Index(si.CachedInfo().Cluster.Leader)
	if leader < 0 {
		t.Fatalf("stream leader %q unknown", si.CachedInfo().Cluster.Leader)
	}
	survivor := (leader + 1) % c.N()
	kvS := kv0
	if survivor == 1 {
		kvS = kv1
	} else if survivor != 0 {
		ncS := connect(t, c.Server(survivor).URL, "natsmesh survivor.1")
		jsS, err := jetstream.New(ncS)
		if err != nil {
			t.Fatal(err)
		}
		if kvS, err = jsS.KeyValue(ctx, "cluster_test"); err != nil {
			t.Fatal(err)
		}
	}
	killedAt := time.Now()
	c.Kill(leader)
	var rev uint64
	for {
		pctx, pcancel := context.WithTimeout(ctx, time.Second)
		rev, err = kvS.Put(pctx, "k", []byte("v2"))
		pcancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("put after killing leader %s: %v", c.Server(leader).Name, err)
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			time.Sleep(50 * time.Millisecond)
		}
	}
	t.Logf("killed stream leader %s: put through %s succeeded %v later", c.Server(leader).Name, c.Server(survivor).Name, time.Since(killedAt))
	// A KV get is a direct get that any replica may answer (allow_direct):
	// one that has yet to apply the acknowledged put answers the older
	// value for a moment (seen once in CI: "v1" at revision 1). The put is
	// acknowledged, so every replica reaches it.
	var last string
	if !natstest.Poll(10*time.Second, func() bool {
		e, err := kvS.Get(ctx, "k")
		if err != nil {
			last = err.Error()
			return false
		}
		last = fmt.Sprintf("%q at revision %d", e.Value(), e.Revision())
		return string(e.Value()) == "v2" && e.Revision() == rev
	}) {
		t.Fatalf("get after leader kill: %s, want \"v2\" at revision %d", last, rev)
	}

	// Restart it; it catches up.
	c.Restart(leader)
	c.WaitReady(t)
	ncR := connect(t, c.Server(leader).URL, "natsmesh restarted.1")
	jsR, err := jetstream.New(ncR)
	if err != nil {
		t.Fatal(err)
	}
	kvR, err := jsR.KeyValue(ctx, "cluster_test")
	if err != nil {
		t.Fatal(err)
	}
	if e, err := kvR.Get(ctx, "k"); err != nil || string(e.Value()) != "v2" {
		t.Fatalf("get through restarted %s: %v %v", c.Server(leader).Name, e, err)
	}
	t.Logf("total %v", time.Since(start))
}

// waitAdvisoryRoute connects and closes probe clients on server i until the
// disconnect advisory of one arrives on ch: then the watcher's interest has
// reached server i over the routes.
func waitAdvisoryRoute(t *testing.T, c *Cluster, i int, ch <-chan *nats.Msg) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for n := 1; ; n++ {
		name := fmt.Sprintf("natsmesh probe-%d.%d", i, n)
		p, err := nats.Connect(c.Server(i).URL, nats.Name(name), nats.NoReconnect())
		if err != nil {
			t.Fatal(err)
		}
		p.Close()
		wait := time.After(250 * time.Millisecond)
	drain:
		for {
			select {
			case m := <-ch:
				var ev server.DisconnectEventMsg
				if json.Unmarshal(m.Data, &ev) == nil && ev.Client.Name == name {
					t.Logf("advisory route from %s ready after %d probe(s)", c.Server(i).Name, n)
					return
				}
			case <-wait:
				break drain
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no disconnect advisory from %s after %d probes", c.Server(i).Name, n)
		}
	}
}

// TestClusterDocsAccountsConf: docs/operations.md gives operators exactly the
// accounts section the test cluster runs with.
func TestClusterDocsAccountsConf(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "```\n"+ClusterAccountsConf+"```\n") {
		t.Fatalf("docs/operations.md does not contain the cluster's accounts section:\n%s", ClusterAccountsConf)
	}
}
