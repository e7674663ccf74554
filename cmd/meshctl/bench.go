package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"
	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"

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

// benchResult is one run of the bench: mesh deliveries or raw requests.
type benchResult struct {
	Target         string  `json:"target"`
	Node           string  `json:"node,omitempty"`
	Deliveries     int     `json:"deliveries"`
	Concurrency    int     `json:"concurrency"`
	Size           int     `json:"size"`
	ElapsedSeconds float64 `json:"elapsed_seconds"`
	PerSecond      float64 `json:"per_second"`
	P50Ms          float64 `json:"p50_ms"`
	P90Ms          float64 `json:"p90_ms"`
	P99Ms          float64 `json:"p99_ms"`
	MaxMs          float64 `json:"max_ms"`
	// Verdicts counts the deliveries by verdict and reason:
	// "Accepted", "ShuttingDown/no-responders", "Failed/timeout", ...
	Verdicts map[string]int `json:"verdicts"`
	Timeouts int            `json:"timeouts"`
	// Unfinished deliveries were in flight when the run stopped: no
	// verdict, outcome unknown.
	Unfinished   int `json:"unfinished,omitempty"`
	PeakInFlight int `json:"peak_legs_in_flight,omitempty"`
	// Aborted says why the run stopped before all deliveries (too many
	// failures: the target is gone or refusing).
	Aborted string `json:"aborted,omitempty"`

	elapsed            time.Duration
	p50, p90, p99, max time.Duration
}

type benchRatio struct {
	Throughput float64 `json:"throughput"` // mesh/raw deliveries per second
	P50        float64 `json:"p50"`        // mesh/raw median latency
}

type benchOutput struct {
	Mesh  *benchResult `json:"mesh"`
	Raw   *benchResult `json:"raw,omitempty"`
	Ratio *benchRatio  `json:"ratio,omitempty"`
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
	out.Mesh = measure(wctx, g, "mesh", f, func(ctx context.Context, lane int) error {
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
		out.Ratio = &benchRatio{Throughput: ratio(out.Mesh.PerSecond, raw.PerSecond), P50: ratio(out.Mesh.P50Ms, raw.P50Ms)}
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

// errTargetGone is the cause a run stops with when its target went away.
type errTargetGone struct{ why string }

func (e errTargetGone) Error() string { return e.why }

// watchTarget pings target's control endpoint until ctx ends and calls stop
// with errTargetGone once the target generation no longer answers: no
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
			stop(errTargetGone{fmt.Sprintf("target node %s is gone (no responders on its control subject for %v)", target, watchGoneFor)})
			return
		case len(msgs) > 0:
			stop(errTargetGone{fmt.Sprintf("target node %s is gone (another generation of %s answers)", target, target.Name)})
			return
		case !nc.IsConnected():
			// This run's own connection is reconnecting: silence (or an
			// error of the ping) says nothing about the target.
		case err != nil:
			stop(errTargetGone{fmt.Sprintf("watching target node %s: %v", target, err)})
			return
		default:
			if misses++; misses >= watchMisses {
				stop(errTargetGone{fmt.Sprintf("target node %s did not answer its control ping for %v", target, watchMisses*watchEvery)})
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
func benchRaw(ctx context.Context, g *globals, nc *nats.Conn, f benchFlags, payload []byte) (*benchResult, error) {
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
	r := measure(ctx, g, "raw", f, func(ctx context.Context, _ int) error {
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

// measure runs f.n calls of op over f.c lanes (each lane sequential, lanes
// concurrent) and summarises them.
func measure(ctx context.Context, g *globals, name string, f benchFlags, op func(ctx context.Context, lane int) error) *benchResult {
	type laneResult struct {
		lat      []time.Duration
		verdicts map[string]int
		timeouts int
	}
	lanes := make([]laneResult, f.c)
	var done, accepted, failed, inARow, unfinished atomic.Int64
	// A run whose target went away would otherwise sit in the retry
	// ladder for every remaining delivery: stop after a run of failures
	// with no success among them.
	maxInARow := int64(max(20, 2*f.c))
	outer := ctx
	ctx, abort := context.WithCancel(ctx)
	defer abort()
	var aborted atomic.Bool
	stopBar := progress(g.stderr, name, f.n, &done, &accepted)
	start := time.Now()
	var wg sync.WaitGroup
	for i := range lanes {
		count := f.n / f.c
		if i < f.n%f.c {
			count++
		}
		wg.Go(func() {
			lr := &lanes[i]
			lr.lat = make([]time.Duration, 0, count)
			lr.verdicts = map[string]int{}
			for range count {
				if ctx.Err() != nil {
					return
				}
				t0 := time.Now()
				err := op(ctx, i)
				if err != nil && ctx.Err() != nil {
					// Cut short by the stop (or Ctrl-C): no verdict.
					unfinished.Add(1)
					return
				}
				lr.lat = append(lr.lat, time.Since(t0))
				lr.verdicts[tallyKey(err)]++
				if isTimeout(err) {
					lr.timeouts++
				}
				done.Add(1)
				if err == nil {
					accepted.Add(1)
				}
				if err == nil {
					inARow.Store(0)
				} else if failed.Add(1); inARow.Add(1) >= maxInARow && aborted.CompareAndSwap(false, true) {
					abort()
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	stopBar()

	r := &benchResult{Concurrency: f.c, Size: f.size, Verdicts: map[string]int{}, elapsed: elapsed}
	var gone errTargetGone
	switch {
	case errors.As(context.Cause(outer), &gone):
		r.Aborted = gone.why
	case aborted.Load():
		r.Aborted = fmt.Sprintf("stopped after %d failures in a row (%d in all)", inARow.Load(), failed.Load())
	}
	r.Unfinished = int(unfinished.Load())
	var lat []time.Duration
	for _, lr := range lanes {
		lat = append(lat, lr.lat...)
		for k, v := range lr.verdicts {
			r.Verdicts[k] += v
		}
		r.Timeouts += lr.timeouts
	}
	r.Deliveries = len(lat)
	sort.Slice(lat, func(a, b int) bool { return lat[a] < lat[b] })
	r.p50, r.p90, r.p99 = percentile(lat, 0.50), percentile(lat, 0.90), percentile(lat, 0.99)
	if len(lat) > 0 {
		r.max = lat[len(lat)-1]
	}
	r.ElapsedSeconds = elapsed.Seconds()
	if elapsed > 0 {
		r.PerSecond = float64(r.Deliveries) / elapsed.Seconds()
	}
	toMs := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	r.P50Ms, r.P90Ms, r.P99Ms, r.MaxMs = toMs(r.p50), toMs(r.p90), toMs(r.p99), toMs(r.max)
	return r
}

// tallyKey is the verdict and reason of a delivery's outcome, e.g.
// "Accepted", "Failed/timeout", "ShuttingDown/no-responders".
func tallyKey(err error) string {
	v := verdict.Classify(err).String()
	if err == nil {
		return v
	}
	switch r := verdict.ReasonOf(err); {
	case r != verdict.ReasonUnknown:
		return v + "/" + r.String()
	case isTimeout(err):
		return v + "/timeout"
	case errors.Is(err, nats.ErrNoResponders):
		return v + "/no-responders"
	case errors.Is(err, nats.ErrDisconnected), errors.Is(err, nats.ErrConnectionClosed):
		return v + "/disconnected"
	case errors.Is(err, context.Canceled):
		return v + "/cancelled"
	}
	return v
}

func isTimeout(err error) bool {
	return err != nil && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout))
}

// percentile returns the nearest-rank p-quantile of sorted.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && (isatty.IsTerminal(f.Fd()) || isatty.IsCygwinTerminal(f.Fd()))
}

// progress draws a bar of done/total on w when w is a terminal, else writes
// a progress line each second, until the returned stop is called.
func progress(w io.Writer, name string, total int, done, accepted *atomic.Int64) (stop func()) {
	if !isTerminal(w) {
		return progressLines(w, name, total, done, accepted)
	}
	bar := progressbar.NewOptions(total,
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetDescription(name),
		progressbar.OptionShowCount(),
		progressbar.OptionShowIts(),
		progressbar.OptionSetItsString("deliveries"),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionClearOnFinish(),
		progressbar.OptionSetWidth(30),
		progressbar.OptionSetRenderBlankState(true),
	)
	quit := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				_ = bar.Set(int(done.Load()))
			case <-quit:
				_ = bar.Set(int(done.Load()))
				_ = bar.Finish()
				return
			}
		}
	}()
	return func() {
		close(quit)
		<-finished
	}
}

// progressLines writes "bench <name>: <done>/<total> deliveries, <n>
// accepted, <rate>/s" to w every second until stop is called.
func progressLines(w io.Writer, name string, total int, done, accepted *atomic.Int64) (stop func()) {
	quit := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		start, last, lastAt := time.Now(), int64(0), time.Now()
		for {
			select {
			case now := <-t.C:
				d := done.Load()
				rate := float64(d-last) / now.Sub(lastAt).Seconds()
				fmt.Fprintf(w, "bench %s: %d/%d deliveries, %d accepted, %.0f/s, %v\n", name, d, total, accepted.Load(), rate, now.Sub(start).Round(time.Second))
				last, lastAt = d, now
			case <-quit:
				return
			}
		}
	}()
	return func() {
		close(quit)
		<-finished
	}
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
		r    *benchResult
	}{{"mesh", out.Mesh}, {"raw", out.Raw}}
	for _, row := range rows {
		r := row.r
		if r == nil {
			continue
		}
		t.row(row.name, r.Deliveries, r.elapsed.Round(time.Millisecond), fmt.Sprintf("%.0f", r.PerSecond),
			ms(r.p50), ms(r.p90), ms(r.p99), ms(r.max), verdictCounts(r))
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
func verdictCounts(r *benchResult) string {
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
		r    *benchResult
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
