package mesh

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/subjects"
)

// BenchmarkColdActivation: deliveries to addresses never seen before (each
// one claimed in the directory, with membership, and built): new addresses
// per second on one node, against the same with a one-node mesh (no claim).
func BenchmarkColdActivation(b *testing.B) {
	for _, mode := range []string{"standalone", "membership"} {
		b.Run(mode, func(b *testing.B) {
			s := natstest.RunServer(b)
			nc := natstest.Connect(b, s)
			cfg := NodeConfig{Conn: nc, Name: "cold", DisableIngress: true, DisableControl: true, Logger: discardLogger}
			if mode == "membership" {
				mc := fastMembership
				cfg.Membership = &mc
			}
			n, err := NewNode(cfg, WithSaturationThreshold(0))
			if err != nil {
				b.Fatal(err)
			}
			defer n.Close()
			_ = n.Register("rec", newRecorder().factory)
			if err := n.Start(); err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := n.Deliver(ctx, Delivery{To: subjects.Address(fmt.Sprintf("rec/%d", i))}); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "activations/s")
		})
	}
}

// BenchmarkResolveWarm: resolving an address whose owner is cached and alive
// (the cost a delivery pays per attempt with membership).
func BenchmarkResolveWarm(b *testing.B) {
	s := natstest.RunServer(b)
	nc := natstest.Connect(b, s)
	mc := fastMembership
	n, err := NewNode(NodeConfig{Conn: nc, Name: "r", DisableIngress: true, DisableControl: true, Membership: &mc, Logger: discardLogger})
	if err != nil {
		b.Fatal(err)
	}
	defer n.Close()
	_ = n.Register("rec", newRecorder().factory)
	if err := n.Start(); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if _, err := n.Deliver(ctx, Delivery{To: "rec/warm"}); err != nil {
		b.Fatal(err)
	}
	d := n.Directory()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := d.Resolve(ctx, "rec/warm"); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSequentialMembership: BenchmarkSequential's mesh case with
// membership on (claims, resolve through the directory cache, fencing).
func BenchmarkSequentialMembership(b *testing.B) {
	s := natstest.RunServer(b)
	nc := natstest.Connect(b, s)
	mc := fastMembership
	n, err := NewNode(NodeConfig{Conn: nc, Name: "seqm", DisableIngress: true, DisableControl: true, Membership: &mc, Logger: discardLogger}, WithSaturationThreshold(0))
	if err != nil {
		b.Fatal(err)
	}
	defer n.Close()
	_ = n.Register("bench", newRecorder().factory)
	if err := n.Start(); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	d := Delivery{To: "bench/seq", Payload: payload128}
	if _, err := n.Deliver(ctx, d); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		d.ID = ""
		if _, err := n.Deliver(ctx, d); err != nil {
			b.Fatal(err)
		}
	}
}

var discardLogger = slog.New(slog.DiscardHandler)

// BenchmarkWarmUnderColdActivations: the latency of deliveries to an active
// address on a node with membership, alone and while another sender
// activates 10 000 cold addresses on the same node (each one a directory
// claim, pipelined off the subscription goroutine), in the same run. Warm
// deliveries must not wait behind other addresses' claims. Run with
// -benchtime=1x: each iteration is the whole scenario.
//
// Two shapes of the cold sender ("loader"):
//   - loader=process: a node in a process of its own (this test binary
//     re-executed as TestColdLoaderProcess), 256 callers, as a storm from
//     other services arrives in production. The owner's process holds the
//     owner node, its warm caller and the NATS server (meshd's default:
//     an embedded server).
//   - loader=process-nice: the same at nice 19, so that on a small machine
//     the loader's own CPU (in production another machine's) takes the
//     cores only when the owner's process leaves them: what is left is
//     what the storm costs the owner's process itself.
//   - loader=raw-process: raw NATS side by side, the same storm without
//     the mesh: the loader process reads the key of each cold address from
//     a KV bucket (as a mesh sender reads the directory) and requests it;
//     the owner's responder creates the key (as a claim does) on a
//     goroutine per request and responds; the warm requests go to a
//     responder that answers at once, on the owner's connection. What the
//     machine's saturation costs any NATS request under such a storm.
//   - loader=in-process: the same node in the owner's process, one
//     goroutine per cold delivery (10 000 at once). The warm caller then
//     also waits in the Go scheduler's run queue behind the loader's
//     goroutines: what it measures is mostly that queue (an execution
//     trace's scheduler-latency profile), not the owner's intake.
func BenchmarkWarmUnderColdActivations(b *testing.B) {
	for _, shape := range []string{"raw-process", "process", "process-nice", "in-process"} {
		b.Run("loader="+shape, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				warmUnderCold(b, shape)
			}
		})
	}
}

const (
	coldStorm     = 10000 // cold addresses the loader activates
	coldCallers   = 256   // the out-of-process loader's concurrent callers
	warmDelivered = 2000  // warm deliveries measured, idle and under the storm
	// coldLoaderEnv carries the NATS URL to TestColdLoaderProcess, and
	// coldLoaderRawEnv (set to 1) has it load the raw shape.
	coldLoaderEnv    = "NATSMESH_COLD_LOADER_URL"
	coldLoaderRawEnv = "NATSMESH_COLD_LOADER_RAW"
)

// coldMembership is the membership of both nodes of the warm-under-cold
// benchmark: fastMembership's verification with a 1 s heartbeat and a TTL
// no stall of the loaded machine outlasts.
func coldMembership() MembershipConfig {
	mc := fastMembership
	mc.Heartbeat, mc.TTL = time.Second, 8*time.Second
	return mc
}

func warmUnderCold(b *testing.B, shape string) {
	b.StopTimer()
	s := natstest.RunServer(b)
	ctx := context.Background()
	// warm sends one warm delivery; coldSeen reports whether the owner
	// has begun on the storm; built counts the cold addresses it finished.
	var warm func(j int) error
	var coldSeen func() bool
	var built func() int
	// storm starts the cold deliveries and returns a wait for their end:
	// how many failed and how long they took.
	var storm func() func() (failed int64, took time.Duration, err error)
	if shape == "raw-process" {
		warm, coldSeen, built = rawColdOwner(b, s)
		storm = coldLoaderProcess(b, s.ClientURL(), false, true)
	} else {
		mc := coldMembership()
		start := func(name string, kinds bool) *Node {
			n, err := NewNode(NodeConfig{Conn: natstest.Connect(b, s), Name: name, DisableIngress: true, DisableControl: true, Membership: &mc, Logger: discardLogger}, WithSaturationThreshold(0))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { n.Close() })
			if kinds {
				_ = n.Register("rec", newRecorder().factory)
			}
			if err := n.Start(); err != nil {
				b.Fatal(err)
			}
			return n
		}
		owner := start("owner", true)
		warm = func(j int) error {
			_, err := owner.Deliver(ctx, Delivery{To: "rec/warm", Payload: []byte(fmt.Sprint(j))})
			return err
		}
		coldSeen = func() bool { return owner.Host().Stats().Claiming > 0 }
		built = func() int { return owner.Host().Stats().Activations - 1 }
		if shape != "in-process" {
			storm = coldLoaderProcess(b, s.ClientURL(), shape == "process-nice", false)
		} else {
			loader := start("loader", false)
			natstest.Eventually(b, 10*time.Second, func() bool { return len(loader.Members().Hosting("rec")) == 1 }, "loader sees the owner")
			storm = func() func() (int64, time.Duration, error) {
				var wg sync.WaitGroup
				var failed atomic.Int64
				t0 := time.Now()
				for j := range coldStorm {
					wg.Add(1)
					go func() {
						defer wg.Done()
						if _, err := loader.Deliver(ctx, Delivery{To: subjects.Address(fmt.Sprintf("rec/cold-%d", j))}); err != nil {
							failed.Add(1)
						}
					}()
				}
				return func() (int64, time.Duration, error) { wg.Wait(); return failed.Load(), time.Since(t0), nil }
			}
		}
	}
	measure := func() []time.Duration {
		lat := make([]time.Duration, 0, warmDelivered)
		for j := range warmDelivered {
			t0 := time.Now()
			if err := warm(j); err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(t0))
		}
		return lat
	}
	measure() // activates rec/warm
	b.StartTimer()
	idle := measure()
	wait := storm()
	natstest.Eventually(b, 30*time.Second, coldSeen, "cold claims in flight")
	// Under the storm: warm deliveries one after another from the owner's
	// first cold claim until the storm's last verdict (only those count,
	// whatever the storm's length), at least 100 of them (in-process, the
	// loader's 10 000 goroutines hold the warm caller to a few hundred).
	var failed int64
	var coldTook time.Duration
	var stormErr error
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		failed, coldTook, stormErr = wait()
	}()
	var loaded []time.Duration
	for j := 0; ; j++ {
		select {
		case <-ended:
		default:
			t0 := time.Now()
			if err := warm(j); err != nil {
				b.Fatal(err)
			}
			loaded = append(loaded, time.Since(t0))
			continue
		}
		break
	}
	coldDuringWarm := built()
	b.StopTimer()
	if stormErr != nil {
		b.Fatal(stormErr)
	}
	if len(loaded) < 100 {
		b.Fatalf("only %d warm deliveries ran during the storm (%v)", len(loaded), coldTook)
	}
	pct := func(lat []time.Duration, p float64) time.Duration {
		slices.Sort(lat)
		return lat[int(p*float64(len(lat)-1))]
	}
	b.ReportMetric(float64(pct(idle, 0.50).Microseconds()), "warm-idle-p50-µs")
	b.ReportMetric(float64(pct(idle, 0.99).Microseconds()), "warm-idle-p99-µs")
	b.ReportMetric(float64(pct(loaded, 0.50).Microseconds()), "warm-cold-p50-µs")
	b.ReportMetric(float64(pct(loaded, 0.99).Microseconds()), "warm-cold-p99-µs")
	b.ReportMetric(float64(coldStorm)/coldTook.Seconds(), "cold-activations/s")
	b.ReportMetric(float64(len(loaded)), "warm-during-storm")
	b.Logf("warm p50/p99: idle %v/%v, during %d cold activations %v/%v (%d warm deliveries; %d cold activations built at the end; cold failed %d; cold took %v)",
		pct(idle, 0.5), pct(idle, 0.99), coldStorm, pct(loaded, 0.5), pct(loaded, 0.99), len(loaded), coldDuringWarm, failed, coldTook)
	if failed > 0 {
		b.Errorf("%d cold deliveries failed", failed)
	}
}

// rawColdBucket is the raw shape's stand-in for the directory.
const rawColdBucket = "raw_cold"

// rawColdOwner is the raw shape's owner: on its own connection, a responder
// on "raw.warm" that answers at once, and one on "raw.cold.*" that creates
// the request's key in rawColdBucket on a goroutine per request and then
// responds (a hand-rolled claim per cold address).
func rawColdOwner(b *testing.B, s *server.Server) (warm func(int) error, coldSeen func() bool, built func() int) {
	nc := natstest.Connect(b, s)
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: rawColdBucket, Storage: jetstream.MemoryStorage, History: 1})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := nc.Subscribe("raw.warm", func(m *nats.Msg) { _ = m.Respond(nil) }); err != nil {
		b.Fatal(err)
	}
	var seen, done atomic.Int64
	sub, err := nc.Subscribe("raw.cold.*", func(m *nats.Msg) {
		seen.Add(1)
		go func() {
			if _, err := kv.Create(ctx, m.Subject[len("raw.cold."):], []byte("owner")); err != nil {
				_ = m.Respond([]byte(err.Error()))
				return
			}
			done.Add(1)
			_ = m.Respond(nil)
		}()
	})
	if err != nil {
		b.Fatal(err)
	}
	_ = sub.SetPendingLimits(-1, -1)
	warm = func(j int) error {
		_, err := nc.Request("raw.warm", []byte(fmt.Sprint(j)), 5*time.Second)
		return err
	}
	return warm, func() bool { return seen.Load() > 0 }, func() int { return int(done.Load()) }
}

// coldLoaderProcess starts TestColdLoaderProcess against url (at the
// lowest CPU priority with nice), waits until
// its node sees a hub of kind "rec", and returns the storm's trigger.
func coldLoaderProcess(b *testing.B, url string, nice, raw bool) func() func() (int64, time.Duration, error) {
	args := []string{os.Args[0], "-test.run=^TestColdLoaderProcess$", "-test.count=1"}
	if nice {
		args = append([]string{"nice", "-n", "19"}, args...)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = append(os.Environ(), coldLoaderEnv+"="+url)
	if raw {
		cmd.Env = append(cmd.Env, coldLoaderRawEnv+"=1")
	}
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	lines := make(chan string, 4)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	next := func(prefix string) (string, error) {
		timeout := time.After(2 * time.Minute)
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					return "", fmt.Errorf("the loader process ended before %q", prefix)
				}
				if rest, ok := strings.CutPrefix(l, prefix); ok {
					return rest, nil
				}
			case <-timeout:
				return "", fmt.Errorf("no %q from the loader process", prefix)
			}
		}
	}
	if _, err := next("ready"); err != nil {
		b.Fatal(err)
	}
	return func() func() (int64, time.Duration, error) {
		if _, err := io.WriteString(stdin, "go\n"); err != nil {
			b.Fatal(err)
		}
		t0 := time.Now()
		// The wait may run on another goroutine: it reports, never fails b.
		return func() (int64, time.Duration, error) {
			l, err := next("done ")
			took := time.Since(t0)
			if err != nil {
				return 0, took, err
			}
			var failed int64
			if _, err := fmt.Sscan(l, &failed); err != nil {
				return 0, took, err
			}
			return failed, took, nil
		}
	}
}

// TestColdLoaderProcess is BenchmarkWarmUnderColdActivations' out-of-process
// loader; it is skipped unless run by it. It joins the mesh at the URL in
// NATSMESH_COLD_LOADER_URL (or, with NATSMESH_COLD_LOADER_RAW=1, binds the
// raw shape's bucket there), prints "ready" once it sees a hub of kind
// "rec" (the bucket), waits for a line on stdin, delivers to coldStorm new addresses
// from coldCallers goroutines, and prints "done <failed>".
func TestColdLoaderProcess(t *testing.T) {
	url := os.Getenv(coldLoaderEnv)
	if url == "" {
		t.Skip("run by BenchmarkWarmUnderColdActivations")
	}
	ctx := context.Background()
	nc := natstest.ConnectURL(t, url)
	// cold delivers to the j-th cold address.
	var cold func(j int) error
	if os.Getenv(coldLoaderRawEnv) == "1" {
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		var kv jetstream.KeyValue
		natstest.Eventually(t, time.Minute, func() bool {
			kv, err = js.KeyValue(ctx, rawColdBucket)
			return err == nil
		}, "the owner's bucket")
		cold = func(j int) error {
			key := fmt.Sprintf("cold-%d", j)
			if _, err := kv.Get(ctx, key); !errors.Is(err, jetstream.ErrKeyNotFound) {
				return fmt.Errorf("read %s: %v", key, err)
			}
			r, err := nc.Request("raw.cold."+key, nil, 10*time.Second)
			if err == nil && len(r.Data) > 0 {
				err = errors.New(string(r.Data))
			}
			return err
		}
	} else {
		mc := coldMembership()
		n, err := NewNode(NodeConfig{Conn: nc, Name: "loader", DisableIngress: true, DisableControl: true, Membership: &mc, Logger: discardLogger})
		if err != nil {
			t.Fatal(err)
		}
		defer n.Close()
		if err := n.Start(); err != nil {
			t.Fatal(err)
		}
		natstest.Eventually(t, time.Minute, func() bool { return len(n.Members().Hosting("rec")) == 1 }, "loader sees the owner")
		cold = func(j int) error {
			_, err := n.Deliver(ctx, Delivery{To: subjects.Address(fmt.Sprintf("rec/cold-%d", j))})
			return err
		}
	}
	fmt.Println("ready")
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var next, failed atomic.Int64
	for range coldCallers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := next.Add(1) - 1; j < coldStorm; j = next.Add(1) - 1 {
				if err := cold(int(j)); err != nil {
					failed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	fmt.Printf("done %d\n", failed.Load())
}
