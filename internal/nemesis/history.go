package nemesis

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/verdict"
)

// Verdict is the class of a delivery's verdict as its caller saw it
// (DESIGN §3), with None for "no verdict recorded".
type Verdict uint8

// Verdicts.
const (
	None Verdict = iota // no verdict: the call never returned
	Accepted
	ShuttingDown
	Ignored
	Unavailable
	Failed
)

var verdictNames = [...]string{None: "None", Accepted: "Accepted", ShuttingDown: "ShuttingDown", Ignored: "Ignored", Unavailable: "Unavailable", Failed: "Failed"}

// String returns the verdict's name ("Accepted", …).
func (v Verdict) String() string {
	if int(v) < len(verdictNames) {
		return verdictNames[v]
	}
	return fmt.Sprintf("Verdict(%d)", uint8(v))
}

// MarshalText encodes the verdict as its name.
func (v Verdict) MarshalText() ([]byte, error) { return []byte(v.String()), nil }

// UnmarshalText decodes a verdict's name; an unknown name is an error.
func (v *Verdict) UnmarshalText(b []byte) error {
	for i, n := range verdictNames {
		if n == string(b) {
			*v = Verdict(i)
			return nil
		}
	}
	return fmt.Errorf("nemesis: unknown verdict %q", b)
}

// OpKind says what an operation did.
type OpKind string

// Operation kinds. Deliver and Request are plain deliveries; the KV kinds
// are Requests to a kv hub (one register per address).
const (
	Deliver OpKind = "deliver"
	Request OpKind = "request"
	KVGet   OpKind = "kv-get"
	KVSet   OpKind = "kv-set"
	KVCas   OpKind = "kv-cas"
)

// IsKV reports whether k is a kv operation.
func (k OpKind) IsKV() bool { return k == KVGet || k == KVSet || k == KVCas }

// Op is one operation of the workload: one delivery from its call to its
// verdict. Times are Unix nanoseconds on the machine's wall clock (every
// process of a run shares it).
type Op struct {
	// ID is the delivery ID, unique in the history.
	ID   string `json:"id"`
	Kind OpKind `json:"kind"`
	// Client is the workload client (a sequential caller) that made it;
	// the kv check names clients in its visualization.
	Client int `json:"client"`
	// Address and Stream are the delivery's lane.
	Address string `json:"addr"`
	Stream  string `json:"stream,omitempty"`
	// Seq is the delivery's sequence number in its lane, in call order,
	// from 1; 0 means the lane's order is not checked.
	Seq        uint64 `json:"seq,omitempty"`
	Idempotent bool   `json:"idempotent,omitempty"`
	// Value is what a kv-set writes or a kv-cas writes if the register
	// holds Expect.
	Value  string `json:"value,omitempty"`
	Expect string `json:"expect,omitempty"`

	Invoke   int64 `json:"invoke"`
	Complete int64 `json:"complete,omitempty"` // 0: the call never returned
	// Resent is when the caller sent it again under the same ID after its
	// verdict (its own re-send, as after a lost answer; Unix ns); 0: it
	// did not. The re-send's outcome is not recorded: its answer is the
	// kept one or a verdict saying it is gone.
	Resent int64 `json:"resent,omitempty"`
	// Final marks a kv-get of the read-back (CheckDurable): made after
	// the workload stopped and every node process was killed and started
	// again, so the register's value came from durable state alone.
	Final bool `json:"final,omitempty"`
	Outcome
}

// Outcome is how an operation ended, as its caller saw it.
type Outcome struct {
	Verdict Verdict `json:"verdict"`
	// Reason is the verdict's reason (verdict.Reason's name) or, for an
	// error the mesh does not type, "timeout" or "other".
	Reason string `json:"reason,omitempty"`
	// Resendable: verdict.IsResendable held — the mesh says the callee
	// holds nothing of it.
	Resendable bool `json:"resendable,omitempty"`
	// Timeout: the verdict is a timeout (a leg's, or the caller's
	// deadline while the response was awaited), never re-sent.
	Timeout bool `json:"timeout,omitempty"`
	// Attempts is how many attempts the sender made (mesh.Receipt).
	Attempts int `json:"attempts,omitempty"`
	// Node is the accepting node generation "name.gen" (mesh.Receipt) or,
	// for a failure, the node its verdict names (verdict.Error.Node: the
	// node that refused, or the owner it names), if any.
	Node string `json:"node,omitempty"`
	// Output is a kv operation's response (a get's value; "ok" or
	// "fail" for a set or cas).
	Output string `json:"output,omitempty"`
	// Err is the error's text, for the report.
	Err string `json:"err,omitempty"`
}

// OutcomeOf classifies a mesh call's error with package verdict: nil is
// Accepted; otherwise the verdict class, reason, whether it is resendable
// and whether it is a timeout (a deadline or NATS timeout anywhere in the
// error graph that verdict.IsResendable does not call resendable: a
// deadline that passed before anything was sent is not a timeout), and the
// node the first *verdict.Error names.
func OutcomeOf(err error) Outcome {
	if err == nil {
		return Outcome{Verdict: Accepted}
	}
	o := Outcome{Err: err.Error(), Resendable: verdict.IsResendable(err)}
	switch verdict.Classify(err) {
	case verdict.Accepted:
		o.Verdict = Failed // Classify never says Accepted for an error; be safe
	case verdict.ShuttingDown:
		o.Verdict = ShuttingDown
	case verdict.Ignored:
		o.Verdict = Ignored
	case verdict.Unavailable:
		o.Verdict = Unavailable
	default:
		o.Verdict = Failed
	}
	var ve *verdict.Error
	if errors.As(err, &ve) {
		o.Node = ve.Node
	}
	o.Timeout = !o.Resendable && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout))
	switch r := verdict.ReasonOf(err); {
	case r != verdict.ReasonUnknown:
		o.Reason = r.String()
	case o.Timeout:
		o.Reason = "timeout"
	default:
		o.Reason = "other"
	}
	return o
}

// Late is a late verdict: a second, final answer to a Deliver accepted
// earlier (DESIGN §5 "Answer once": its build failed, or it was
// deactivated before it was handled).
type Late struct {
	ID string `json:"id"`
	At int64  `json:"at"`
	Outcome
}

// Leg is one attempt of a delivery as its sender reported it (the
// "attempt" events of the delivery's trace span, DESIGN §11): the attempt
// number and the verdict of that leg alone. CheckTimeoutNotResent reads
// the legs that timed out.
type Leg struct {
	ID      string `json:"id"`
	Attempt int    `json:"attempt"`
	Node    string `json:"node,omitempty"` // the node generation it was sent to, "name.gen"
	Verdict string `json:"verdict"`        // verdict.Verdict's name
	Reason  string `json:"reason,omitempty"`
}

// TimedOut reports whether the leg was sent and timed out: the callee may
// hold it, so it must be the delivery's last attempt (DESIGN §3).
func (l Leg) TimedOut() bool { return l.Verdict == "Failed" && l.Reason == "timeout" }

// Turn is one handler turn on a hub, as its node process logged it.
type Turn struct {
	// Process names the OS process that ran it (unique in the run, e.g.
	// "n1#2": the third process named n1).
	Process string `json:"process"`
	// Node and Generation are the node generation whose activation ran it.
	Node       string `json:"node"`
	Generation uint64 `json:"gen"`
	// Activation identifies the activation inside the address (its state
	// epoch: strictly increasing across the address's activations).
	Activation uint64 `json:"activation"`
	Address    string `json:"addr"`
	Stream     string `json:"stream,omitempty"`
	ID         string `json:"id"`
	// Attempt is the sender's attempt that was accepted (1-based).
	Attempt int `json:"attempt"`
	// Claim is the revision of the claim its activation held when it
	// started (the directory's KV revision at the claim's issue); 0: no
	// claim. Checked by CheckClaims.
	Claim uint64 `json:"claim,omitempty"`
	// ClaimGone: its node's directory no longer held that claim when it
	// started (released or lost). Checked by CheckClaims.
	ClaimGone bool  `json:"claim_gone,omitempty"`
	Start     int64 `json:"start"`
	End       int64 `json:"end,omitempty"` // 0: no end logged (see History.Exits)
	// NoEffect: the handler ended with an error saying it persisted
	// nothing (TurnEvent.NoEffect).
	NoEffect bool `json:"no_effect,omitempty"`
}

// FaultRecord is one fault as it was applied, for the report.
type FaultRecord struct {
	Fault
	// Process is the node process it hit (Turn.Process), for node faults.
	Process string `json:"process,omitempty"`
	// Isolated lists, for RouteCut, the node processes connected to the
	// isolated server when it was cut off: the fault cut them off.
	Isolated []string `json:"isolated,omitempty"`
	// SenderCut is, for RouteCut, whether the workload's sender was
	// connected to the isolated server: it could reach no node but those
	// on it (CheckAtMostOnce: a caller's re-send it could not deliver to
	// the accepting node may land on another).
	SenderCut bool   `json:"sender_cut,omitempty"`
	Start     int64  `json:"start"` // when it was injected
	End       int64  `json:"end"`   // when it was healed (the process restarted, woken, the link restored)
	Note      string `json:"note,omitempty"`
}

// hits reports whether f hit process p itself: a node fault on it, or a
// route cut of the server it was connected to.
func (f FaultRecord) hits(p string) bool {
	return f.Kind.OnNode() && f.Process == p || f.Kind == RouteCut && slices.Contains(f.Isolated, p)
}

// cutsOff reports whether f cut process p off from the rest of the
// cluster while it lasted: all of its links cut, or its server isolated.
func (f FaultRecord) cutsOff(p string) bool {
	return f.Kind == LinkCut && f.Process == p || f.Kind == RouteCut && slices.Contains(f.Isolated, p)
}

// cutsOffSender reports whether f cut process p off from the workload's
// sender: a route cut that isolated the sender's server (SenderCut) and not
// p's. A turn p started just before the cut had its acceptance reply lost
// to it as surely as if p had been isolated (TestNemesisIdle, seed 2104: a
// turn started 1 ms before such a cut, the sender's leg ended resendable,
// and its re-send ran on a node on the sender's side).
func (f FaultRecord) cutsOffSender(p string) bool {
	return f.Kind == RouteCut && f.SenderCut && !slices.Contains(f.Isolated, p)
}

// History is everything one run recorded.
type History struct {
	Seed  uint64 `json:"seed"`
	Start int64  `json:"start"`
	End   int64  `json:"end"` // when recording stopped: an open turn lasts until then
	Ops   []Op   `json:"ops"`
	Late  []Late `json:"late,omitempty"`
	// Legs are the attempts the sender reported, where it traced them
	// (Recorder.AddLeg); none: the run recorded no legs.
	Legs   []Leg         `json:"legs,omitempty"`
	Turns  []Turn        `json:"turns"`
	Faults []FaultRecord `json:"faults,omitempty"`
	// Exits maps a process (Turn.Process) to when it was seen to exit: a
	// turn with no end logged ended at the latest then.
	Exits map[string]int64 `json:"exits,omitempty"`
	// Streams are the sync-stream subscriptions' outcomes once the faults
	// stopped (CheckStreams).
	Streams []StreamOutcome `json:"streams,omitempty"`
}

// StreamOutcome is how one sync-stream subscription of the workload ended
// up once the faults stopped: whether its mirror reached the owner's state
// (DESIGN §7: a subscription is never silently stale), and how long that
// took.
type StreamOutcome struct {
	Address string `json:"address"`
	// Converged: the mirror equalled the owner's state, read through the
	// owner's own turns, within the bound the run allowed.
	Converged bool `json:"converged"`
	// Waited is how long after the faults stopped the mirror was first
	// seen equal (ns), or the whole bound when it never was.
	Waited int64 `json:"waited"`
	// Mirror and Owner are the last states compared (key -> value).
	Mirror map[string]string `json:"mirror"`
	Owner  map[string]string `json:"owner"`
	// Closed is the error the subscription ended with, if it ended: a
	// subscription the workload never stopped must not end.
	Closed string `json:"closed,omitempty"`
	// Frames, Stale and Resubscribes are the subscription's counters.
	Frames       int64 `json:"frames"`
	Stale        int64 `json:"stale"`
	Resubscribes int64 `json:"resubscribes"`
	// Writes is how many changes the workload's writer had accepted.
	Writes int `json:"writes"`
}

// turnEnd returns when t ended: its logged end, else its process's exit,
// else the end of the history.
func (h *History) turnEnd(t Turn) int64 {
	if t.End != 0 {
		return t.End
	}
	if e, ok := h.Exits[t.Process]; ok {
		return e
	}
	return h.End
}

// WriteJSON writes h to path as indented JSON, replacing the file; errors
// are the file system's.
func (h *History) WriteJSON(path string) error {
	b, err := json.MarshalIndent(h, "", " ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

// ReadJSON reads a history WriteJSON wrote. Errors: the file system's, or
// the file is not a history's JSON.
func ReadJSON(path string) (*History, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var h History
	if err := json.Unmarshal(b, &h); err != nil {
		return nil, fmt.Errorf("nemesis: %s: %w", path, err)
	}
	return &h, nil
}

// Recorder records a history while a run goes on. Safe for concurrent use.
type Recorder struct {
	mu sync.Mutex
	h  History
}

// NewRecorder starts a history for seed at start (Unix ns).
func NewRecorder(seed uint64, start int64) *Recorder {
	return &Recorder{h: History{Seed: seed, Start: start, Exits: map[string]int64{}}}
}

// Invoke records op's call (op.Invoke set by the caller) and returns its
// handle for Complete.
func (r *Recorder) Invoke(op Op) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.h.Ops = append(r.h.Ops, op)
	return len(r.h.Ops) - 1
}

// Complete records that the operation Invoke returned i for ended at
// (Unix ns) with o.
func (r *Recorder) Complete(i int, at int64, o Outcome) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.h.Ops[i].Complete = at
	r.h.Ops[i].Outcome = o
}

// Resent records that the caller re-sent operation i at (Unix ns), under
// its ID, after its verdict (Op.Resent).
func (r *Recorder) Resent(i int, at int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.h.Ops[i].Resent = at
}

// AddLate records a late verdict.
func (r *Recorder) AddLate(l Late) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.h.Late = append(r.h.Late, l)
}

// AddLeg records one attempt the sender reported.
func (r *Recorder) AddLeg(l Leg) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.h.Legs = append(r.h.Legs, l)
}

// AddStream records a sync-stream subscription's outcome.
func (r *Recorder) AddStream(o StreamOutcome) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.h.Streams = append(r.h.Streams, o)
}

// AddFault records an applied fault.
func (r *Recorder) AddFault(f FaultRecord) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.h.Faults = append(r.h.Faults, f)
}

// Exit records that process exited at (Unix ns).
func (r *Recorder) Exit(process string, at int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.h.Exits[process] = at
}

// Finish returns the history with turns added and End set to end; the
// recorder keeps its copy.
func (r *Recorder) Finish(end int64, turns []Turn) *History {
	r.mu.Lock()
	defer r.mu.Unlock()
	h := r.h
	h.End = end
	h.Ops = slices.Clone(r.h.Ops)
	h.Late = slices.Clone(r.h.Late)
	h.Legs = slices.Clone(r.h.Legs)
	h.Faults = slices.Clone(r.h.Faults)
	h.Turns = slices.Clone(turns)
	h.Exits = make(map[string]int64, len(r.h.Exits))
	for k, v := range r.h.Exits {
		h.Exits[k] = v
	}
	return &h
}
