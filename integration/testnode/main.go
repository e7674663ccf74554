// Command testnode is the mesh node the integration tests run as a separate
// OS process where crash semantics matter (SIGKILL, SIGSTOP). It is meshd's
// daemon with three test hub kinds besides echo:
//
//	hold   accepts every delivery and never finishes handling it (requests
//	       await a response that never comes, until the process dies)
//	count  reports each execution as a request to the subject "test.exec"
//	       (headers Mesh-Id, Test-Node, Test-Address, Test-Stream,
//	       Test-Start and Test-At (ns: the turn's start and end), Test-Exec
//	       (unique per execution, the same on retries of the report), and
//	       for a reminder's fire Test-Reminder and Test-Due; the
//	       payload is the delivery's), retried until the test answers,
//	       before it returns, so a test counts executions, their order and
//	       overlaps across processes; and, with --report-factories, each
//	       factory run to "test.factory" (Test-Node, Test-Address, Test-At,
//	       Test-Exec)
//	slow   like count, after 50 ms of work
//	dctr   the durable counter (internal/counterhub, DESIGN §7a): "inc" adds one,
//	       saves, then responds with the new value; it remembers the delivery
//	       IDs of each stream's last 4 increments, so a re-sent one is
//	       answered, not counted again. A delivery with payload "hold" reports "test.hold"
//	       (headers Test-Node, Test-Address) and sleeps --hold-save between
//	       its change and its save; its save's outcome, and
//	       every failed save, is reported to "test.save" (headers Test-Node,
//	       Test-Address, Test-Value, Test-Err), acknowledged and retried
//	fail   every handler turn returns an error (handler-error)
//	nlane  the nemesis's lane hub (integration.TestNemesis): responds with
//	       the payload
//	nkv    the nemesis's kv hub: one durable register per address (DESIGN
//	       §7a): type "get" responds with the value, "set" saves the payload
//	       and responds "ok", "cas" (payload "<expect>\n<new>") saves <new>
//	       and responds "ok" if the register holds <expect>, else responds
//	       "fail"; a failed save is the handler's error
//
// The nemesis kinds take their address's durable state over when they are
// built (the record names the node generation and the activation's epoch)
// and log every turn's start and end as a JSON line on stdout
// (nemesis.TurnEvent): the harness captures stdout, so the turn log
// survives the process (a SIGKILL loses no line written before it) and
// needs no NATS to get out.
//
// Its first stdout line matches meshd's: "meshd: node <id> serving on NATS at <url>".
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"

	"github.com/natsmesh/natsmesh/daemon"
	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/counterhub"
	"github.com/natsmesh/natsmesh/internal/nemesis"
	"github.com/natsmesh/natsmesh/mesh"
	"github.com/natsmesh/natsmesh/subjects"
)

func main() {
	name := flag.String("name", "t", "node name")
	url := flag.String("nats-url", "", "NATS URLs")
	hb := flag.Duration("heartbeat", 250*time.Millisecond, "registry heartbeat")
	ttl := flag.Duration("ttl", time.Second, "registry TTL")
	replicas := flag.Int("kv-replicas", 1, "KV replicas")
	kvCluster := flag.String("kv-cluster", "", "the NATS cluster the buckets this node creates are placed in")
	drain := flag.Duration("drain-timeout", 10*time.Second, "drain deadline")
	ingress := flag.Bool("ingress", true, "serve the ingress")
	httpAddr := flag.String("http", "", "metrics address")
	replace := flag.Bool("replace", false, "supersede a live node of the same name")
	holdSave := flag.Duration("hold-save", 3*time.Second, "how long a dctr delivery with payload \"hold\" waits before its save")
	reportFactories := flag.Bool("report-factories", false, "report each factory run of the count kinds to test.factory")
	dataDir := flag.String("data-dir", "", "the node's data directory (lock and holder record, as meshd's --data-dir); empty: none")
	leaf := flag.String("leaf-remote", "", "run an embedded server as a leaf node of this hub (as meshd's --leaf-remote)")
	listen := flag.String("listen", "", "the embedded server's client address (with --leaf-remote)")
	idle := flag.Duration("idle-timeout", 0, "collect an activation idle this long (as meshd's --idle-timeout); 0: the default")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	// The report connection: to --nats-url, or — an embedded server (a
	// leaf node) — to it once it serves (reports wait for it).
	var pub *nats.Conn
	pubReady := make(chan struct{})
	dial := func(u string) {
		c, err := nats.Connect(u, nats.Name("testnode-exec "+*name), nats.MaxReconnects(-1))
		if err != nil {
			fmt.Fprintln(os.Stderr, "testnode:", err)
			os.Exit(2)
		}
		pub = c
		close(pubReady)
	}
	if *url != "" {
		dial(*url)
	}
	defer func() {
		select {
		case <-pubReady:
			_ = pub.Flush() // every execution event reaches the test
			pub.Close()
		default:
		}
	}()
	report := func(m *nats.Msg) error {
		// Acknowledged and retried, so that no event is lost when a NATS
		// server dies under the test.
		var err error
		for range 20 {
			<-pubReady
			if _, err = pub.RequestMsg(m, 2*time.Second); err == nil {
				return nil
			}
			time.Sleep(50 * time.Millisecond) // no responders while the test's connection moves
		}
		return err
	}
	counting := func(work time.Duration) hub.Factory {
		return func(_ context.Context, addr subjects.Address) (hub.Hub, error) {
			f := nats.NewMsg("test.factory")
			f.Header.Set("Test-Node", *name)
			f.Header.Set("Test-Address", string(addr))
			f.Header.Set("Test-At", strconv.FormatInt(time.Now().UnixNano(), 10))
			f.Header.Set("Test-Exec", nuid.Next())
			if *reportFactories {
				if err := report(f); err != nil {
					return nil, err
				}
			}
			return hub.HandlerFunc(func(ctx context.Context, d *hub.Delivery) error {
				started := time.Now().UnixNano()
				if work > 0 {
					time.Sleep(work)
				}
				m := nats.NewMsg("test.exec")
				m.Header.Set("Mesh-Id", d.ID)
				m.Header.Set("Test-Node", *name)
				m.Header.Set("Test-Address", string(d.To))
				m.Header.Set("Test-Stream", string(d.Stream))
				m.Header.Set("Test-Start", strconv.FormatInt(started, 10))
				m.Header.Set("Test-At", strconv.FormatInt(time.Now().UnixNano(), 10))
				m.Header.Set("Test-Exec", nuid.Next())
				if d.Reminder != "" {
					m.Header.Set("Test-Reminder", d.Reminder)
					m.Header.Set("Test-Due", d.Due.Format(time.RFC3339Nano))
				}
				m.Data = d.Payload
				if err := report(m); err != nil {
					return err
				}
				return d.Respond(d.Payload)
			}), nil
		}
	}
	reportDelivery := func(subject string, d *hub.Delivery, hdr map[string]string) {
		m := nats.NewMsg(subject)
		m.Header.Set("Mesh-Id", d.ID)
		m.Header.Set("Test-Node", *name)
		m.Header.Set("Test-Address", string(d.To))
		m.Header.Set("Test-Exec", nuid.Next())
		for k, v := range hdr {
			m.Header.Set(k, v)
		}
		for range 20 {
			<-pubReady
			if _, err := pub.RequestMsg(m, 2*time.Second); err == nil {
				return
			}
		}
	}
	dctr := counterhub.Factory(counterhub.Options{
		Remember: 4, // per stream: a re-sent increment is answered its value, not counted again
		BeforeSave: func(d *hub.Delivery) {
			if string(d.Payload) == "hold" {
				reportDelivery("test.hold", d, nil)
				time.Sleep(*holdSave)
			}
		},
		OnSave: func(d *hub.Delivery, v uint64, err error) {
			if err == nil && string(d.Payload) != "hold" {
				return
			}
			e := ""
			if err != nil {
				e = err.Error()
			}
			reportDelivery("test.save", d, map[string]string{"Test-Value": strconv.FormatUint(v, 10), "Test-Err": e})
		},
	})
	err := daemon.Run(ctx, daemon.Config{
		Name: *name, NATSURL: *url, LeafRemote: *leaf, Listen: *listen, KVReplicas: *replicas, KVCluster: *kvCluster, Heartbeat: *hb, TTL: *ttl, DrainTimeout: *drain,
		DisableIngress: !*ingress, HTTP: *httpAddr, Replace: *replace, DataDir: *dataDir, IdleTimeout: *idle,
		Logger: slog.New(slog.NewJSONHandler(os.Stderr, nil)),
		Kinds: map[string]hub.Factory{
			"hold": func(context.Context, subjects.Address) (hub.Hub, error) {
				return hub.HandlerFunc(func(ctx context.Context, d *hub.Delivery) error {
					<-ctx.Done()
					return ctx.Err()
				}), nil
			},
			"fail": func(context.Context, subjects.Address) (hub.Hub, error) {
				return hub.HandlerFunc(func(context.Context, *hub.Delivery) error {
					return errors.New("the fail kind fails every delivery")
				}), nil
			},
			"count": counting(0),
			"dctr":  dctr,
			"slow":  counting(50 * time.Millisecond),
			"nlane": nemesisKind(laneTurn),
			"nkv":   nemesisKind(kvTurn),
		},
		Ready: func(i daemon.Info) {
			running.Store(i.Mesh)
			if pub == nil {
				dial(i.NATSURL)
			}
			if i.HTTPAddr != "" {
				fmt.Printf("testnode: http %s\n", i.HTTPAddr)
			}
			fmt.Printf("meshd: node %s serving on NATS at %s\n", i.Node, i.NATSURL)
		},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "testnode:", err)
		os.Exit(2)
	}
}

// running is the node daemon.Run started (set by Ready), for claimGone.
var running atomic.Pointer[mesh.Node]

// claimGone reports whether the running node's directory of generation gen
// no longer holds t (Directory.Holds): the activation's claim was released
// or lost under it. False while unknown: before Ready, without a claim, or
// when the node is no longer on gen (a rejoin: another directory).
func claimGone(gen uint64, t hub.ClaimToken) bool {
	n := running.Load()
	if n == nil || t.Rev == 0 {
		return false
	}
	d := n.Directory() // before the generation: a rejoin between them shows as another generation
	if d == nil || n.ID().Generation != gen {
		return false
	}
	return !d.Holds(t)
}

// turnLog writes the nemesis kinds' turn events to stdout, one line each.
var turnLog struct {
	mu sync.Mutex
	n  atomic.Uint64
}

func logTurn(e nemesis.TurnEvent) {
	e.At = time.Now().UnixNano()
	turnLog.mu.Lock()
	defer turnLog.mu.Unlock()
	_, _ = os.Stdout.Write(e.Line())
}

// nemesisKind returns the factory of a nemesis kind whose turns run turn:
// it takes the address's state over, then logs each turn's start and end
// around turn; the end says whether the turn's error says it persisted
// nothing (hub.ErrStateFenced, hub.ErrStateUnavailable).
func nemesisKind(turn func(ctx context.Context, st *hub.State, value *string, d *hub.Delivery) error) hub.Factory {
	return func(ctx context.Context, addr subjects.Address) (hub.Hub, error) {
		st, err := hub.LoadState(ctx)
		if err != nil {
			return nil, err
		}
		rec := st.Record()
		value := string(rec.Data)
		return hub.HandlerFunc(func(ctx context.Context, d *hub.Delivery) error {
			n := turnLog.n.Add(1)
			logTurn(nemesis.TurnEvent{Event: nemesis.TurnStart, N: n, Node: rec.Owner.Name, Generation: rec.Owner.Generation,
				Activation: rec.Epoch, Address: string(d.To), Stream: string(d.Stream), ID: d.ID, Attempt: d.Attempt, Claim: d.Claim().Rev,
				ClaimGone: claimGone(rec.Owner.Generation, d.Claim())})
			err := turn(ctx, st, &value, d)
			logTurn(nemesis.TurnEvent{Event: nemesis.TurnEnd, N: n,
				NoEffect: errors.Is(err, hub.ErrStateFenced) || errors.Is(err, hub.ErrStateUnavailable)})
			return err
		}), nil
	}
}

func laneTurn(_ context.Context, _ *hub.State, _ *string, d *hub.Delivery) error {
	return d.Respond(d.Payload)
}

func kvTurn(ctx context.Context, st *hub.State, value *string, d *hub.Delivery) error {
	next := ""
	switch d.Type {
	case "get":
		return d.Respond([]byte(*value))
	case "set":
		next = string(d.Payload)
	case "cas":
		expect, nv, ok := strings.Cut(string(d.Payload), "\n")
		if !ok {
			return fmt.Errorf("cas payload %q: want <expect>\\n<new>", d.Payload)
		}
		if *value != expect {
			return d.Respond([]byte(nemesis.KVFail))
		}
		next = nv
	default:
		return fmt.Errorf("unknown kv operation %q", d.Type)
	}
	if err := st.Save(ctx, []byte(next)); err != nil {
		return err
	}
	*value = next
	return d.Respond([]byte(nemesis.KVOK))
}
