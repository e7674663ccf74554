package nemesis

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
)

// TurnEvent is one line of a node process's turn log: the start or the end
// of a handler turn, as JSON on one line of its stdout. Start lines carry
// every field; end lines carry Event, N, NoEffect and At.
type TurnEvent struct {
	Event      string `json:"turn"` // TurnStart or TurnEnd
	N          uint64 `json:"n"`    // the turn's number in its process
	Node       string `json:"node,omitempty"`
	Generation uint64 `json:"gen,omitempty"`
	Activation uint64 `json:"activation,omitempty"`
	Address    string `json:"addr,omitempty"`
	Stream     string `json:"stream,omitempty"`
	ID         string `json:"id,omitempty"`
	Attempt    int    `json:"attempt,omitempty"`
	// Claim (start lines) is the revision of the claim the activation
	// held when the turn started (hub.Delivery.Claim); 0: none.
	Claim uint64 `json:"claim,omitempty"`
	// ClaimGone (start lines): the node's directory no longer held that
	// claim when the turn started (released or lost: Directory.Holds).
	ClaimGone bool `json:"claim_gone,omitempty"`
	// NoEffect (end lines): the handler returned an error saying it
	// persisted nothing (its state save was fenced or the store was
	// unreachable: nothing written, DESIGN §7a).
	NoEffect bool  `json:"no_effect,omitempty"`
	At       int64 `json:"at"` // Unix ns
}

// TurnEvent kinds.
const (
	TurnStart = "start"
	TurnEnd   = "end"
)

// Line returns e as one JSON line (with its newline), as a node writes it.
func (e TurnEvent) Line() []byte {
	b, _ := json.Marshal(e) // a struct of strings and numbers always encodes
	return append(b, '\n')
}

// ParseTurnLog reads the turn log of one process (its whole stdout: lines
// that are not turn events are skipped) and returns its turns, a start
// paired with the end of the same number; a turn whose end is missing (the
// process died mid-turn, or its turn never returned) has End 0. It fails
// on a malformed turn line, an end without a start, or a number started
// twice.
func ParseTurnLog(process string, r io.Reader) ([]Turn, error) {
	open := map[uint64]int{} // turn number -> index in turns
	ended := map[uint64]bool{}
	var turns []Turn
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for line := 1; sc.Scan(); line++ {
		text := sc.Text()
		if !strings.HasPrefix(text, `{"turn":`) {
			continue
		}
		var e TurnEvent
		if err := json.Unmarshal([]byte(text), &e); err != nil {
			return nil, fmt.Errorf("nemesis: %s line %d: %w", process, line, err)
		}
		switch e.Event {
		case TurnStart:
			if _, dup := open[e.N]; dup || ended[e.N] {
				return nil, fmt.Errorf("nemesis: %s line %d: turn %d started twice", process, line, e.N)
			}
			open[e.N] = len(turns)
			turns = append(turns, Turn{
				Process: process, Node: e.Node, Generation: e.Generation, Activation: e.Activation,
				Address: e.Address, Stream: e.Stream, ID: e.ID, Attempt: e.Attempt, Claim: e.Claim, ClaimGone: e.ClaimGone, Start: e.At,
			})
		case TurnEnd:
			i, ok := open[e.N]
			if !ok {
				return nil, fmt.Errorf("nemesis: %s line %d: turn %d ended but never started", process, line, e.N)
			}
			turns[i].End = e.At
			turns[i].NoEffect = e.NoEffect
			delete(open, e.N)
			ended[e.N] = true
		default:
			return nil, fmt.Errorf("nemesis: %s line %d: unknown turn event %q", process, line, e.Event)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("nemesis: %s: %w", process, err)
	}
	sort.SliceStable(turns, func(i, j int) bool { return turns[i].Start < turns[j].Start })
	return turns, nil
}
