package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/natsmesh/natsmesh/mesh"
	"github.com/natsmesh/natsmesh/mesh/membership"
	"github.com/natsmesh/natsmesh/profiles"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/syncstream"
	"github.com/natsmesh/natsmesh/verdict"
)

// leaveTimeout bounds leaving the mesh when subscribe ends.
const leaveTimeout = 3 * time.Second

// newSubscribeCmd builds `subscribe`.
func newSubscribeCmd(g *globals) *cobra.Command {
	var count int
	cmd := &cobra.Command{
		Use:   "subscribe ADDR [STREAM]",
		Short: "Follow a hub's sync stream and print its frames as they arrive",
		Long: `Subscribe to STREAM (default "": the destination-wide stream) of the hub at
ADDR ("kind/id") and print every frame the subscription applies, in order,
until Ctrl-C, --count frames, or the subscription is torn down. The first
frame is the snapshot (the stream's full state), then come the deltas; a new
owner activation starts a new epoch with a new snapshot.

meshctl registers for the duration as a subscriber named meshctl-<random>,
which hosts nothing: the owner reaches the subscriber's address through the
directory, so this needs the mesh's membership (JetStream on the NATS
account, and nodes running with membership on --prefix). A subscriber is not
a mesh node: meshctl nodes counts it apart ("sees 2, +1 subscriber") and the
nodes' membership metrics leave it out. It leaves when it ends.

Table output is one line per frame:
  epoch=<epoch> version=<version> snapshot|delta <data>
with the data as text if it is valid UTF-8, else base64. -o json prints one
JSON object per line (JSON lines): {"epoch", "version", "snapshot", "data"},
with "data_base64" instead of "data" for data that is not UTF-8.

Exits 0 after --count frames; 130 on Ctrl-C; 2 without JetStream; 3 when no
mesh membership runs on --prefix, the subscribe is refused, or the
subscription is torn down (the error is printed); 4 when the owner does not
answer the subscribe, or sends no snapshot, within --timeout.`,
		Example: `  meshctl subscribe kv/settings
  meshctl subscribe kv/settings -o json --count 1 | jq .data
  meshctl subscribe orders/42 s1`,
		Args: cobra.RangeArgs(1, 2),
	}
	cmd.Flags().IntVar(&count, "count", 0, "exit (0) after printing this many frames; 0 means until Ctrl-C")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		addr, err := subjects.ParseAddress(args[0])
		if err != nil {
			return usageErrorf("invalid address %q: %v", args[0], err)
		}
		var stream subjects.Stream
		if len(args) == 2 {
			stream = subjects.Stream(args[1])
			if err := stream.Validate(); err != nil {
				return usageErrorf("invalid stream %q: %v", args[1], err)
			}
		}
		if count < 0 {
			return usageErrorf("invalid --count %d (want >= 0)", count)
		}
		return subscribe(cmd.Context(), g, addr, stream, count)
	}
	return cmd
}

// subscribe runs the command once its arguments are checked.
func subscribe(ctx context.Context, g *globals, addr subjects.Address, stream subjects.Stream, count int) error {
	name := subscriberNodeName()
	if g.inboxPrefix == "" {
		// It joins as a node: the node profile's inbox (SECURITY.md).
		g.inboxPrefix = profiles.NodeInboxPrefix(g.meshPrefix())
	}
	nc, err := g.connect(membership.ConnNamePrefix + name)
	if err != nil {
		return err
	}
	defer nc.Close()
	connLost := make(chan struct{})
	var lostOnce sync.Once
	// With NoReconnect a closed connection is final; a Close of ours
	// fires nothing (NoCallbacksAfterClientClose).
	nc.SetClosedHandler(func(*nats.Conn) { lostOnce.Do(func() { close(connLost) }) })

	mc, err := g.meshMembership(ctx, nc)
	if err != nil {
		return err
	}
	quiet := slog.New(slog.DiscardHandler)
	node, err := mesh.NewNode(mesh.NodeConfig{
		Conn: nc, Name: name, Prefix: g.meshPrefix(), Membership: mc,
		DisableIngress: true, DisableControl: true, Logger: quiet,
	})
	if err != nil {
		return exitf(exitUsage, "subscriber node: %v", err)
	}
	if err := joinMesh(ctx, node); err != nil {
		return err
	}
	defer leave(node)

	q := &frameQueue{limit: count, ready: make(chan struct{}, 1)}
	sctx, cancel := context.WithTimeout(ctx, g.timeout)
	sub, err := syncstream.Subscribe(sctx, node, addr, stream, q.push)
	cancel()
	if err != nil {
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.Is(err, context.DeadlineExceeded):
			return exitf(exitTimeout, "subscribe to %s: no answer in %v (is a node hosting kind %q running on prefix %s?)", target(addr, stream), g.timeout, addr.Kind(), g.prefix)
		}
		return exitf(exitVerdict, "subscribe to %s refused: %s", target(addr, stream), describeError(err))
	}
	defer func() {
		sub.Stop()
		q.close()
	}()

	out := frameWriter{g: g}
	printed := 0
	// flush prints the frames applied so far; done reports --count reached.
	flush := func() (done bool, err error) {
		for _, f := range q.take() {
			if err := out.write(f); err != nil {
				return false, exitf(exitUsage, "write output: %v", err)
			}
			printed++
		}
		return count > 0 && printed >= count, nil
	}
	// The snapshot follows the subscribe's answer at once: without one in
	// --timeout the hub does not serve sync streams (or cannot reach us).
	noSnapshot := time.NewTimer(g.timeout)
	defer noSnapshot.Stop()
	for {
		select {
		case <-q.ready:
			done, err := flush()
			if err != nil || done {
				return err
			}
			if printed > 0 {
				noSnapshot.Stop()
			}
		case <-noSnapshot.C:
			if printed == 0 && q.len() == 0 {
				return exitf(exitTimeout, "subscribed to %s but no snapshot came in %v: does the hub serve sync streams?", target(addr, stream), g.timeout)
			}
		case <-sub.Closed():
			if done, err := flush(); err != nil || done {
				return err
			}
			if err := sub.Err(); err != nil {
				return exitf(exitVerdict, "subscription to %s torn down: %s", target(addr, stream), describeError(err))
			}
			return exitf(exitVerdict, "subscription to %s ended", target(addr, stream))
		case <-connLost:
			if _, err := flush(); err != nil {
				return err
			}
			return exitf(exitNoNATS, "lost the NATS connection to %s", g.server)
		case <-ctx.Done():
			if _, err := flush(); err != nil {
				return err
			}
			return ctx.Err()
		}
	}
}

// subscriberNodeName is "meshctl-" and 12 random hex digits.
func subscriberNodeName() string {
	var b [6]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return "meshctl-" + hex.EncodeToString(b[:])
}

// target names the subscribed stream in messages.
func target(addr subjects.Address, stream subjects.Stream) string {
	if stream == "" {
		return string(addr)
	}
	return fmt.Sprintf("%s stream %q", addr, stream)
}

// meshMembership returns the membership settings to join the mesh of
// --prefix with: those of its registry bucket (TTL and replicas), so that
// joining leaves the bucket as the mesh configured it — joining creates or
// updates the bucket with the joiner's settings, and a TTL shorter than the
// nodes' heartbeat would expire every node. No bucket means no node runs
// with membership on the prefix.
func (g *globals) meshMembership(ctx context.Context, nc *nats.Conn) (*mesh.MembershipConfig, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, exitf(exitNoNATS, "JetStream: %v", err)
	}
	ctx, cancel := context.WithTimeout(ctx, g.timeout)
	defer cancel()
	if _, err := js.AccountInfo(ctx); err != nil {
		if errors.Is(err, jetstream.ErrJetStreamNotEnabled) || errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount) {
			return nil, exitf(exitNoNATS, "sync streams need the mesh's membership, which needs JetStream: %v on this NATS account", err)
		}
		return nil, natsError(err, "JetStream account info")
	}
	bucket := membership.BucketName(g.meshPrefix())
	kv, err := js.KeyValue(ctx, bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, exitf(exitVerdict, "no mesh membership on prefix %s (no registry bucket %s): sync streams need nodes running with membership", g.prefix, bucket)
	}
	if err != nil {
		return nil, natsError(err, "registry bucket %s", bucket)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		return nil, natsError(err, "registry bucket %s", bucket)
	}
	ttl := membership.RegistryTTL(st)
	if ttl <= 0 {
		return nil, exitf(exitVerdict, "registry bucket %s has no TTL: not a natsmesh registry", bucket)
	}
	// The disconnect advisory of this user's account, which the node
	// profile allows (the default wildcard it refuses); none when the
	// server does not say: a subscriber reads departures from the registry
	// then.
	adv, err := membership.AccountAdvisorySubject(ctx, nc)
	if err != nil {
		adv = "-"
	}
	return &mesh.MembershipConfig{Heartbeat: min(membership.DefaultHeartbeat, ttl/3), TTL: ttl, Replicas: st.Config().Replicas, Subscriber: true, AdvisorySubject: adv}, nil
}

// joinMesh starts node: it joins the mesh. Start cannot be interrupted; on
// Ctrl-C it is left to finish in the background and the node closed then.
func joinMesh(ctx context.Context, node *mesh.Node) error {
	started := make(chan error, 1)
	go func() { started <- node.Start() }()
	var err error
	select {
	case err = <-started:
	case <-ctx.Done():
		go func() {
			<-started
			_ = node.Close()
		}()
		return ctx.Err()
	}
	if err == nil {
		return nil
	}
	_ = node.Close()
	switch {
	case errors.Is(err, jetstream.ErrJetStreamNotEnabled), errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount):
		return exitf(exitNoNATS, "sync streams need the mesh's membership, which needs JetStream: join the mesh: %v", err)
	case errors.Is(err, nats.ErrTimeout), errors.Is(err, context.DeadlineExceeded):
		return exitf(exitTimeout, "join the mesh: no answer in time: %v", err)
	}
	return exitf(exitNoNATS, "join the mesh: %v", err)
}

// leave takes the node out of the mesh: its registration is deleted at
// once rather than left to expire.
func leave(node *mesh.Node) {
	ctx, cancel := context.WithTimeout(context.Background(), leaveTimeout)
	defer cancel()
	if node.Drain(ctx) != nil {
		_ = node.Close()
	}
}

// describeError is a one-line description of a mesh error: its verdict,
// reason and message.
func describeError(err error) string {
	var ve *verdict.Error
	if !errors.As(err, &ve) {
		return err.Error()
	}
	s := verdict.Classify(err).String()
	if ve.Reason != verdict.ReasonUnknown {
		s += " (" + ve.Reason.String() + ")"
	}
	msg := ve.Message
	if msg == "" {
		msg = ve.Reason.String()
	}
	s += ": " + msg
	if ve.Err != nil {
		s += ": " + ve.Err.Error()
	}
	if ve.Node != "" && !strings.Contains(s, ve.Node) {
		s += " [node " + ve.Node + "]"
	}
	return s
}

// frameQueue hands the frames the subscription applies (on its handler,
// one at a time) to the command's goroutine, which prints them: the handler
// never blocks on the output. It keeps at most limit frames (0: no limit).
type frameQueue struct {
	mu     sync.Mutex
	frames []syncstream.Frame
	taken  int
	limit  int
	closed bool
	ready  chan struct{} // capacity 1: frames are waiting
}

func (q *frameQueue) push(f syncstream.Frame) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed || q.limit > 0 && q.taken >= q.limit {
		return
	}
	q.taken++
	q.frames = append(q.frames, f)
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

func (q *frameQueue) take() []syncstream.Frame {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := q.frames
	q.frames = nil
	return out
}

func (q *frameQueue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.frames)
}

func (q *frameQueue) close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
	q.frames = nil
}

// frameOut is a frame in JSON output.
type frameOut struct {
	Epoch      uint64  `json:"epoch"`
	Version    uint64  `json:"version"`
	Snapshot   bool    `json:"snapshot"`
	Data       *string `json:"data,omitempty"`
	DataBase64 *string `json:"data_base64,omitempty"`
}

// frameWriter prints frames, one line each.
type frameWriter struct{ g *globals }

func (w frameWriter) write(f syncstream.Frame) error {
	text := utf8.Valid(f.Data)
	data := string(f.Data)
	if !text {
		data = base64.StdEncoding.EncodeToString(f.Data)
	}
	if w.g.json() {
		o := frameOut{Epoch: f.Epoch, Version: f.Version, Snapshot: f.Snapshot}
		if text {
			o.Data = &data
		} else {
			o.DataBase64 = &data
		}
		// Encode writes one line: JSON lines.
		return json.NewEncoder(w.g.stdout).Encode(o)
	}
	kind := "delta"
	if f.Snapshot {
		kind = "snapshot"
	}
	line := fmt.Sprintf("epoch=%d version=%d %s", f.Epoch, f.Version, kind)
	if data != "" {
		line += " " + data
	}
	_, err := fmt.Fprintln(w.g.stdout, line)
	return err
}
