package nemesis

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"time"
)

// FaultKind is a kind of fault the nemesis injects.
type FaultKind string

// Fault kinds.
const (
	// NodeKill sends SIGKILL to a node process and starts it again (a new
	// generation of the same name) after Hold.
	NodeKill FaultKind = "node-kill"
	// NodeFreeze sends SIGSTOP to a node process and SIGCONT after Hold,
	// which is longer than the detection time plus the fencing delay: the
	// node is declared gone and its addresses are taken over while it is
	// frozen, and it must fence itself when it wakes.
	NodeFreeze FaultKind = "node-freeze"
	// ServerLameDuck puts a NATS server in lame duck mode (SIGUSR2),
	// waits for it to exit and starts it again.
	ServerLameDuck FaultKind = "server-lame-duck"
	// ServerKill sends SIGKILL to a NATS server and starts it again after
	// Hold.
	ServerKill FaultKind = "server-kill"
	// LinkCut cuts every NATS link of a node (through its TCP proxies)
	// for Hold — closed at once, or (Drop) silently dropped — then
	// restores it.
	LinkCut FaultKind = "link-cut"
	// LeaderKill sends SIGKILL to the NATS server that leads one of the
	// mesh's JetStream buckets at the moment of injection — Target 0 the
	// registry, 1 the directory, 2 the hub state — and starts it again
	// after Hold: a leader election in the middle of claims, heartbeats or
	// saves.
	LeaderKill FaultKind = "leader-kill"
	// NodeDrain sends SIGTERM to a node process (a graceful drain: its
	// activations are settled and handed over, it leaves the registry),
	// waits for it to exit and starts it again after Hold: a node leaving
	// and joining mid-burst.
	NodeDrain FaultKind = "node-drain"
	// LinkSlow makes every NATS link of a node slow (through its TCP
	// proxies) for Hold: each chunk is held Delay (20–150 ms) before it is
	// passed on — latency and a bandwidth bound, below the ping bound at
	// the workload's rate, so the node stays connected.
	LinkSlow FaultKind = "link-slow"
	// RouteCut isolates the NATS server node Target is connected to
	// from the other servers for Hold — its routes closed at once, or
	// (Drop) silently dropped — while its clients stay connected to it,
	// then restores the routes: the nodes on it (FaultRecord.Isolated,
	// Target among them) keep their links up and reach neither
	// the other nodes nor the JetStream majority, so they notice only by
	// their failing heartbeats (the lease, DESIGN §6), and past the TTL
	// the others take their addresses over.
	RouteCut FaultKind = "route-cut"
)

// LeaderBuckets is how many buckets LeaderKill targets (its Target's range).
const LeaderBuckets = 3

// AllFaultKinds lists every fault kind.
var AllFaultKinds = []FaultKind{NodeKill, NodeFreeze, ServerLameDuck, ServerKill, LinkCut, LeaderKill, NodeDrain, LinkSlow, RouteCut}

// OnNode reports whether the fault's Target is a node (else a server, or
// for LeaderKill a bucket).
func (k FaultKind) OnNode() bool {
	return k == NodeKill || k == NodeFreeze || k == LinkCut || k == NodeDrain || k == LinkSlow || k == RouteCut
}

// Fault is one scheduled fault.
type Fault struct {
	// At is when to inject it, from the start of the run. A runner that
	// is still recovering from the previous fault injects it late.
	At   time.Duration `json:"at"`
	Kind FaultKind     `json:"kind"`
	// Target is the node index (NodeKill, NodeFreeze, LinkCut, NodeDrain,
	// LinkSlow; RouteCut: the server it is on), the server index
	// (ServerLameDuck, ServerKill), or the bucket
	// (LeaderKill: 0 registry, 1 directory, 2 hub state).
	Target int `json:"target"`
	// Hold is how long the fault lasts before it is healed (0 for
	// ServerLameDuck: the server restarts once it exited; for NodeDrain,
	// counted from the drained process's exit).
	Hold time.Duration `json:"hold,omitempty"`
	// Drop, for LinkCut and RouteCut: drop bytes silently instead of
	// closing.
	Drop bool `json:"drop,omitempty"`
	// Delay, for LinkSlow: how long each chunk is held.
	Delay time.Duration `json:"delay,omitempty"`
}

// String describes the fault on one line.
func (f Fault) String() string {
	target := fmt.Sprintf("server %d", f.Target)
	switch {
	case f.Kind == RouteCut:
		target = fmt.Sprintf("the server of node %d", f.Target)
	case f.Kind.OnNode():
		target = fmt.Sprintf("node %d", f.Target)
	case f.Kind == LeaderKill:
		target = "the leader of " + [LeaderBuckets]string{"the registry", "the directory", "the hub state"}[f.Target]
	}
	s := fmt.Sprintf("%v %s %s", f.At, f.Kind, target)
	if f.Hold > 0 {
		s += fmt.Sprintf(" for %v", f.Hold)
	}
	if f.Kind == LinkCut || f.Kind == RouteCut {
		s += map[bool]string{true: " (dropped)", false: " (closed)"}[f.Drop]
	}
	if f.Kind == LinkSlow {
		s += fmt.Sprintf(" (%v a chunk)", f.Delay)
	}
	return s
}

// Schedule is a seeded fault schedule.
type Schedule struct {
	Seed   uint64
	Faults []Fault
}

// String lists the faults, one a line.
func (s Schedule) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d: %d faults", s.Seed, len(s.Faults))
	for _, f := range s.Faults {
		b.WriteString("\n  ")
		b.WriteString(f.String())
	}
	return b.String()
}

// ScheduleConfig says what to generate.
type ScheduleConfig struct {
	Seed uint64
	// Duration is how long the run injects faults: no fault is scheduled
	// to start after it.
	Duration time.Duration
	// Nodes and Servers are how many node processes and NATS servers
	// there are (targets are drawn among them); each must be positive.
	Nodes, Servers int
	// Kinds are the fault kinds to draw; nil means AllFaultKinds. Every
	// run of len(Kinds) consecutive faults holds each kind once (a seeded
	// permutation), so a schedule of that many faults covers every kind.
	Kinds []FaultKind
	// FreezePast is the least time a node must stay frozen to be declared
	// gone and taken over: detection plus the fencing delay. 0 means 4 s.
	FreezePast time.Duration
	// Settle is the quiet time expected after each fault is healed
	// (recovery) before the next; 0 means 2 s. The next fault's At is
	// the previous one's At + Hold + Settle + a seeded jitter of up to
	// Settle.
	Settle time.Duration
}

// Generate returns the schedule for c; the same config (seed included)
// always yields the same schedule. It draws from math/rand/v2 with a PCG
// source seeded by c.Seed. It fails on a config with no nodes or servers
// or an unknown kind.
func Generate(c ScheduleConfig) (Schedule, error) {
	if c.Nodes < 1 || c.Servers < 1 {
		return Schedule{}, fmt.Errorf("nemesis: schedule needs nodes and servers (got %d, %d)", c.Nodes, c.Servers)
	}
	kinds := c.Kinds
	if kinds == nil {
		kinds = AllFaultKinds
	}
	for _, k := range kinds {
		if !validKind(k) {
			return Schedule{}, fmt.Errorf("nemesis: unknown fault kind %q", k)
		}
	}
	if c.FreezePast == 0 {
		c.FreezePast = 4 * time.Second
	}
	if c.Settle == 0 {
		c.Settle = 2 * time.Second
	}
	rng := rand.New(rand.NewPCG(c.Seed, c.Seed^0x6e656d65736973)) // "nemesis"
	between := func(lo, hi time.Duration) time.Duration {
		d := lo + time.Duration(rng.Int64N(int64(hi-lo)+1))
		return d.Round(time.Millisecond)
	}
	s := Schedule{Seed: c.Seed}
	at := between(c.Settle/2, c.Settle) // traffic flows before the first fault
	var round []FaultKind
	for at < c.Duration {
		if len(round) == 0 {
			round = make([]FaultKind, len(kinds))
			for i, j := range rng.Perm(len(kinds)) {
				round[i] = kinds[j]
			}
		}
		k := round[0]
		round = round[1:]
		f := Fault{At: at, Kind: k}
		switch {
		case k.OnNode():
			f.Target = rng.IntN(c.Nodes)
		case k == LeaderKill:
			f.Target = rng.IntN(LeaderBuckets)
		default:
			f.Target = rng.IntN(c.Servers)
		}
		switch k {
		case NodeKill:
			f.Hold = between(200*time.Millisecond, 3*time.Second)
		case NodeFreeze:
			f.Hold = between(c.FreezePast, c.FreezePast+2*time.Second)
		case ServerKill, LeaderKill:
			f.Hold = between(500*time.Millisecond, 4*time.Second)
		case NodeDrain:
			f.Hold = between(200*time.Millisecond, 2*time.Second)
		case LinkCut:
			f.Hold = between(500*time.Millisecond, 4*time.Second)
			f.Drop = rng.IntN(2) == 1
		case RouteCut:
			// Up to past the TTL (8 s by default) and the fencing
			// delay: short cuts the nodes on the isolated server ride
			// out, long ones end in their lease lapsing and a takeover.
			f.Hold = between(1*time.Second, 12*time.Second)
			f.Drop = rng.IntN(2) == 1
		case LinkSlow:
			f.Hold = between(1*time.Second, 4*time.Second)
			// At most 150 ms: a round trip of four chunks (600 ms) and
			// the pump's bound (32 KiB a delay, 213 KiB/s) stay inside
			// the ping bound (~1 s) at the workload's rate; at 250 ms a
			// hostile review saw 150 kB/s go stale, which is a link cut
			// (recorded as none).
			f.Delay = between(20*time.Millisecond, 150*time.Millisecond)
		}
		s.Faults = append(s.Faults, f)
		at += f.Hold + c.Settle + between(0, c.Settle)
	}
	return s, nil
}

func validKind(k FaultKind) bool {
	for _, a := range AllFaultKinds {
		if a == k {
			return true
		}
	}
	return false
}

// ParseFaultKinds parses a comma-separated list of fault kinds ("" means
// nil: all kinds); an unknown kind is an error.
func ParseFaultKinds(s string) ([]FaultKind, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var out []FaultKind
	for _, p := range strings.Split(s, ",") {
		k := FaultKind(strings.TrimSpace(p))
		if !validKind(k) {
			return nil, fmt.Errorf("nemesis: unknown fault kind %q (known: %v)", k, AllFaultKinds)
		}
		out = append(out, k)
	}
	return out, nil
}
