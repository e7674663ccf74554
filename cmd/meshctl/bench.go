package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"
	"github.com/spf13/cobra"

	"github.com/natsmesh/natsmesh/internal/loadgen"
	"github.com/natsmesh/natsmesh/mesh"
	"github.com/natsmesh/natsmesh/profiles"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

type benchFlags struct {
	to       string
	n, c     int
	size     int
	node     string
	baseline bool
}

type benchRatio struct {
	Throughput float64 `json:"throughput"` // mesh/raw deliveries per second
	P50        float64 `json:"p50"`        // mesh/raw median latency
}

type benchOutput struct {
	Mesh  *loadgen.Result `json:"mesh"`
	Raw   *loadgen.Result `json:"raw,omitempty"`
	Ratio *benchRatio     `json:"ratio,omitempty"`
}

func newBenchCmd(g *globals) *cobra.Command {
	var f benchFlags
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure delivery throughput and latency",
		Long: `Send -n deliveries to --to over -c concurrent lanes (lane i is the stream
"bench-<i>": deliveries on one lane are sequential, lanes run concurrently)
with a mesh client that sends straight to one node, and print deliveries per
second, p50/p90/p99 latency and the verdicts by reason. As a mesh client it
needs the node permission profile (SECURITY.md) and reads its answers on the
node inbox prefix unless --inbox-prefix says otherwise.

The target node is the node named --node if given (it must own --to, else
every delivery is refused not-owner); else the owner of --to, found by one
warm-up delivery through the ingress (which activates --to there); else the
first node (by name) that hosts the kind of --to. The client caps legs in
flight at 256, as any mesh client does by default, and does not retry: a
refusal is counted under its verdict and reason. A delivery counts as
Accepted when the hub took it into its inbox (DESIGN §5: answer on
acceptance); a handler that then fails it (e.g. kv/… takes only the types
set, delete and get) shows in the node's log, not here.

--baseline also runs the same shape (-n requests, -c concurrent requesters,
the same payload) as plain NATS requests to a responder inside meshctl that
answers at once, and prints the ratios mesh/raw: what the mesh costs over
bare request/reply on this server. Above -c 256 the shapes differ: the mesh
client keeps at most 256 legs in flight, raw has -c requests in flight.

Progress: a bar on stderr when it is a terminal, else a line on stderr each
second. The target's control endpoint is pinged every 500 ms: a target that
stops answering (gone, or frozen for 1.5 s) stops the run, and the results
measured so far are printed, as they are after Ctrl-C. Any delivery that is
not Accepted makes the exit code 3 (4 if all of those timed out).`,
		Example: `  meshctl bench
  meshctl bench -n 50000 -c 64 --size 1024 --baseline -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runBench(cmd.Context(), g, f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.to, "to", "echo/bench", "destination address (its kind must be hosted by the target node)")
	fl.IntVarP(&f.n, "count", "n", 10000, "number of deliveries")
	fl.IntVarP(&f.c, "concurrency", "c", 16, "concurrent lanes (streams bench-0 .. bench-<c-1>)")
	fl.IntVar(&f.size, "size", 128, "payload size in bytes")
	fl.StringVar(&f.node, "node", "", "deliver straight to the node of this name (it must own --to, else every delivery is refused); default: the owner of --to, found through the ingress")
	fl.BoolVar(&f.baseline, "baseline", false, "also measure plain NATS request/reply of the same shape")
	return cmd
}

func runBench(ctx context.Context, g *globals, f benchFlags) error {
	addr, err := subjects.ParseAddress(f.to)
	if err != nil {
		return usageErrorf("invalid --to address %q: %v", f.to, err)
	}
	if f.n < 1 {
		return usageErrorf("invalid -n %d (want >= 1)", f.n)
	}
	if f.c < 1 {
		return usageErrorf("invalid -c %d (want >= 1)", f.c)
	}
	if f.size < 0 {
		return usageErrorf("invalid --size %d (want >= 0)", f.size)
	}
	if f.node != "" {
		if err := subjects.ValidateNodeName(f.node); err != nil {
			return usageErrorf("invalid --node: %v", err)
		}
	}
	f.c = min(f.c, f.n)

	// The run rides out a rolling restart of the NATS servers: its
	// connection reconnects, and moves off a server in lame duck mode
	// without losing an answer in flight (mesh.Client.MoveConnection).
	var clientRef atomic.Pointer[mesh.Client]
	userInbox := g.inboxPrefix
	if g.inboxPrefix == "" {
		// A mesh client: the acceptance replies it reads carry the keys
		// of answers, so they go to the node profile's inbox
		// (SECURITY.md), as meshctl subscribe's do.
		g.inboxPrefix = profiles.NodeInboxPrefix(g.meshPrefix())
	}
	nc, err := g.connectReconnecting("meshctl bench", func() {
		if c := clientRef.Load(); c != nil {
			go func() {
				mctx, cancel := context.WithTimeout(ctx, mesh.DefaultMoveTimeout)
				defer cancel()
				_ = c.MoveConnection(mctx)
			}()
		}
	})
	if err != nil {
		return err
	}
	defer nc.Close()
	// Leave room for the delivery headers under max_payload.
	if max := nc.MaxPayload(); max > 0 && int64(f.size)+1024 > max {
		return usageErrorf("--size %d is over the server's max_payload of %d (less 1024 bytes for headers)", f.size, max)
	}
	target, err := benchTarget(ctx, g, nc, userInbox, addr, f.node)
	if err != nil {
		return err
	}
	payload := make([]byte, f.size)
	for i := range payload {
		payload[i] = 'a' + byte(i%26)
	}

	client, err := mesh.NewClient(mesh.Config{Conn: nc, Resolver: mesh.StaticResolver{Node: target}, Prefix: g.meshPrefix()},
		mesh.WithLogger(slog.New(slog.DiscardHandler)), mesh.WithLegTimeout(g.timeout))
	// One fixed node: a resendable failure (its subscription briefly gone
	// while its connection moves, this connection reconnecting) is re-sent
	// to it by the default ladder; a target that is really gone is caught
	// by watchTarget, which ends the run.
	if err != nil {
		return exitf(exitNoNATS, "mesh client: %v", err)
	}
	clientRef.Store(client)
	defer client.Close()
	streams := make([]subjects.Stream, f.c)
	for i := range streams {
		streams[i] = subjects.Stream(fmt.Sprintf("bench-%d", i))
	}
	out := benchOutput{}
	wctx, stopWatch := context.WithCancelCause(ctx)
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		watchTarget(wctx, g, nc, target, stopWatch)
	}()
	out.Mesh = loadgen.Run(wctx, loadgen.Spec{Name: "mesh", N: f.n, C: f.c, Size: f.size, Progress: g.stderr}, func(ctx context.Context, lane int) error {
		ctx, cancel := context.WithTimeout(ctx, g.timeout)
		defer cancel()
		_, err := client.Deliver(ctx, mesh.Delivery{To: addr, Stream: streams[lane], Payload: payload})
		return err
	})
	stopWatch(nil)
	<-watchDone
	out.Mesh.Target, out.Mesh.Node = string(addr), target.String()
	out.Mesh.PeakInFlight = client.Saturation().PeakInFlight
	if ctx.Err() != nil || out.Mesh.Aborted != "" {
		// Interrupted or aborted: show what was measured.
		if err := printBench(g, f, out); err != nil {
			return exitf(exitUsage, "write output: %v", err)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return benchFailures(out)
	}

	if f.baseline {
		raw, err := benchRaw(ctx, g, nc, f, payload)
		if err != nil {
			return err
		}
		out.Raw = raw
		out.Ratio = &benchRatio{Throughput: loadgen.Ratio(out.Mesh.PerSecond, raw.PerSecond), P50: loadgen.Ratio(out.Mesh.P50Ms, raw.P50Ms)}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err := printBench(g, f, out); err != nil {
		return exitf(exitUsage, "write output: %v", err)
	}
	return benchFailures(out)
}

// benchTarget picks the node to deliver to: the named one, else the owner
// of addr found by a warm-up delivery through the ingress, else the first
// (by name) that hosts the address's kind and is not draining. The warm-up
// goes on a connection of its own with the user's inbox prefix (userInbox,
// empty for nats.go's default): the ingress answers no reply under the
// nodes' inbox, which nc uses.
func benchTarget(ctx context.Context, g *globals, nc *nats.Conn, userInbox string, addr subjects.Address, name string) (subjects.NodeID, error) {
	if name == "" {
		// With several nodes the address has one owner: activate it
		// through the ingress and bench the node that accepted it.
		nodeInbox := g.inboxPrefix
		g.inboxPrefix = userInbox
		wc, err := g.connect("meshctl bench warm-up")
		g.inboxPrefix = nodeInbox
		if err != nil {
			return subjects.NodeID{}, err
		}
		a, err := deliverIngress(ctx, wc, g.meshPrefix(), ingressDelivery{To: addr, Type: "natsmesh.bench.warmup"}, g.timeout)
		wc.Close()
		if err == nil && a.Err == nil && a.Node != "" {
			if id, perr := subjects.ParseNodeID(a.Node); perr == nil {
				return id, nil
			}
		}
	}
	nodes, err := g.discover(ctx, nc)
	if err != nil {
		return subjects.NodeID{}, err
	}
	if name != "" {
		nodes = slices.DeleteFunc(nodes, func(d discovered) bool { return d.Name != name })
		if len(nodes) == 0 {
			return subjects.NodeID{}, exitf(exitVerdict, "no node named %s on prefix %s", name, g.prefix)
		}
	} else if len(nodes) == 0 {
		return subjects.NodeID{}, exitf(exitVerdict, "no natsmesh node found on prefix %s", g.prefix)
	}
	statuses, err := control[mesh.NodeStatus](ctx, g, nc, nodes, mesh.ControlPing)
	if err != nil && len(statuses) == 0 {
		return subjects.NodeID{}, err
	}
	slices.SortFunc(statuses, func(a, b mesh.NodeStatus) int { return compareNodes(a.Node, b.Node) })
	var kinds []string
	for _, s := range statuses {
		kinds = append(kinds, s.Node+" ["+strings.Join(s.Kinds, ",")+"]")
		if s.Draining || !slices.Contains(s.Kinds, addr.Kind()) {
			continue
		}
		id, err := subjects.ParseNodeID(s.Node)
		if err != nil {
			continue
		}
		return id, nil
	}
	return subjects.NodeID{}, exitf(exitVerdict, "no live node hosts kind %q of %s (nodes: %s)", addr.Kind(), addr, orDash(strings.Join(kinds, " ")))
}

// Target watch: the bench pings its target's control endpoint every
// watchEvery; watchMisses pings in a row without its answer stop the run.
// No responders on its control subject stops the run once it has lasted
// watchGoneFor (re-checked every watchGoneEvery): a target whose
// connection moves to another server (a rolling restart) has no
// subscription for a moment, a dead one never again.
const (
	watchEvery     = 500 * time.Millisecond
	watchMisses    = 3
	watchGoneFor   = time.Second
	watchGoneEvery = 100 * time.Millisecond
)

// watchTarget pings target's control endpoint until ctx ends and calls stop
// with a loadgen.Stop once the target generation no longer answers: no
// responders (its process is gone), another generation answering under its
// name, or watchMisses pings in a row unanswered (frozen or cut off). A
// target that serves no control endpoint from the start is not watched.
func watchTarget(ctx context.Context, g *globals, nc *nats.Conn, target subjects.NodeID, stop context.CancelCauseFunc) {
	subject := g.controlSubject(target.Name, mesh.ControlPing)
	misses, answered := 0, false
	var goneSince time.Time // no responders since then (zero: it answered)
	t := time.NewTicker(watchEvery)
	defer t.Stop()
	for {
		msgs, gone, err := gather(ctx, nc, subject, nil, 0, watchEvery)
		if ctx.Err() != nil {
			return
		}
		self := false
		for _, m := range msgs {
			var st mesh.NodeStatus
			if json.Unmarshal(m.Data, &st) == nil && st.Node == target.String() {
				self = true
			}
		}
		if !gone {
			goneSince = time.Time{}
		}
		switch {
		case self:
			misses, answered = 0, true
		case !answered && gone:
			return // no control endpoint: nothing to watch
		case gone && goneSince.IsZero():
			goneSince = time.Now()
			fallthrough
		case gone && time.Since(goneSince) < watchGoneFor:
			select {
			case <-ctx.Done():
				return
			case <-time.After(watchGoneEvery):
			}
			continue
		case gone:
			stop(&loadgen.Stop{Why: fmt.Sprintf("target node %s is gone (no responders on its control subject for %v)", target, watchGoneFor)})
			return
		case len(msgs) > 0:
			stop(&loadgen.Stop{Why: fmt.Sprintf("target node %s is gone (another generation of %s answers)", target, target.Name)})
			return
		case !nc.IsConnected():
			// This run's own connection is reconnecting: silence (or an
			// error of the ping) says nothing about the target.
		case err != nil:
			stop(&loadgen.Stop{Why: fmt.Sprintf("watching target node %s: %v", target, err)})
			return
		default:
			if misses++; misses >= watchMisses {
				stop(&loadgen.Stop{Why: fmt.Sprintf("target node %s did not answer its control ping for %v", target, watchMisses*watchEvery)})
				return
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// benchRaw runs the baseline: plain requests to a responder on its own
// connection that answers Accepted at once.
func benchRaw(ctx context.Context, g *globals, nc *nats.Conn, f benchFlags, payload []byte) (*loadgen.Result, error) {
	rc, err := g.connect("meshctl bench responder")
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	subject := g.meshPrefix().Sub("bench.raw." + nuid.Next())
	accepted := nats.Header{verdict.HeaderVerdict: []string{verdict.Accepted.String()}}
	sub, err := rc.Subscribe(subject, func(m *nats.Msg) {
		_ = m.RespondMsg(&nats.Msg{Header: accepted})
	})
	if err != nil {
		return nil, natsError(err, "baseline responder")
	}
	defer func() { _ = sub.Unsubscribe() }()
	_ = sub.SetPendingLimits(-1, -1)
	if err := rc.Flush(); err != nil {
		return nil, natsError(err, "baseline responder")
	}
	r := loadgen.Run(ctx, loadgen.Spec{Name: "raw", N: f.n, C: f.c, Size: f.size, Progress: g.stderr}, func(ctx context.Context, _ int) error {
		ctx, cancel := context.WithTimeout(ctx, g.timeout)
		defer cancel()
		reply, err := nc.RequestWithContext(ctx, subject, payload)
		if err != nil {
			return err
		}
		_, err = verdict.Decode(reply.Header)
		return err
	})
	r.Target = subject
	return r, nil
}

func printBench(g *globals, f benchFlags, out benchOutput) error {
	if g.json() {
		return writeJSON(g.stdout, out)
	}
	w := g.stdout
	count := fmt.Sprint(f.n)
	if out.Mesh.Deliveries < f.n {
		count = fmt.Sprintf("%d of %d", out.Mesh.Deliveries, f.n)
	}
	lanes := "lanes"
	if out.Mesh.Concurrency == 1 {
		lanes = "lane"
	}
	fmt.Fprintf(w, "%s deliveries of %d bytes to %s on node %s over %d %s\n\n", count, f.size, out.Mesh.Target, out.Mesh.Node, out.Mesh.Concurrency, lanes)
	t := newTable(w, "RUN", "DELIVERIES", "ELAPSED", "PER SECOND", "P50", "P90", "P99", "MAX", "VERDICTS")
	rows := []struct {
		name string
		r    *loadgen.Result
	}{{"mesh", out.Mesh}, {"raw", out.Raw}}
	for _, row := range rows {
		r := row.r
		if r == nil {
			continue
		}
		t.row(row.name, r.Deliveries, r.Elapsed.Round(time.Millisecond), fmt.Sprintf("%.0f", r.PerSecond),
			ms(r.P50), ms(r.P90), ms(r.P99), ms(r.Max), verdictCounts(r))
	}
	if err := t.flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "\npeak legs in flight (mesh client): %d\n", out.Mesh.PeakInFlight)
	if out.Mesh.Aborted != "" {
		fmt.Fprintf(w, "run aborted: %s; the results above are what was measured until then\n", out.Mesh.Aborted)
	}
	if out.Mesh.Unfinished > 0 {
		fmt.Fprintf(w, "%d deliveries were in flight when the run stopped (no verdict: outcome unknown)\n", out.Mesh.Unfinished)
	}
	if out.Ratio != nil {
		_, err := fmt.Fprintf(w, "ratio mesh/raw: throughput %.2fx, p50 latency %.2fx\n", out.Ratio.Throughput, out.Ratio.P50)
		return err
	}
	return nil
}

// verdictCounts formats the verdict counts, Accepted first.
func verdictCounts(r *loadgen.Result) string {
	keys := make([]string, 0, len(r.Verdicts))
	for k := range r.Verdicts {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int {
		if (a == "Accepted") != (b == "Accepted") {
			if a == "Accepted" {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%d", k, r.Verdicts[k])
	}
	return strings.Join(parts, " ")
}

// benchFailures returns the exit error for deliveries not Accepted.
func benchFailures(out benchOutput) error {
	var msgs []string
	failed, timeouts := 0, 0
	for _, x := range []struct {
		name string
		r    *loadgen.Result
	}{{"mesh", out.Mesh}, {"raw", out.Raw}} {
		if x.r == nil {
			continue
		}
		bad := x.r.Deliveries - x.r.Verdicts["Accepted"]
		if bad == 0 {
			continue
		}
		failed += bad
		timeouts += x.r.Timeouts
		msgs = append(msgs, fmt.Sprintf("%d of %d %s deliveries not accepted (%s)", bad, x.r.Deliveries, x.name, verdictCounts(x.r)))
	}
	if out.Mesh.Aborted != "" {
		msgs = append([]string{"run aborted: " + out.Mesh.Aborted}, msgs...)
		return exitf(exitVerdict, "bench: %s", strings.Join(msgs, "; "))
	}
	if failed == 0 {
		return nil
	}
	code := exitVerdict
	if timeouts == failed {
		code = exitTimeout
	}
	return exitf(code, "bench: %s", strings.Join(msgs, "; "))
}
