package mesh

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/internal/histo"
	"github.com/natsmesh/natsmesh/verdict"
)

// ClientStats are the client's cumulative counters.
type ClientStats struct {
	// Accepted counts deliveries a hub accepted (Deliver, DeliverAsync and
	// the delivery part of Request): acceptance, not the final outcome.
	Accepted int64 `json:"accepted"`
	// Failed counts deliveries whose final outcome is a failure verdict
	// (including a Request whose handler failed or whose response never
	// came).
	Failed  int64 `json:"failed"`
	Retries int64 `json:"retries"` // re-sends after a resendable failure
	// ByVerdict counts each delivery once, by its final outcome: a Deliver
	// by the verdict it returned, a Request by its response ("Accepted") or
	// failure. Keys: "Accepted", "Failed", "Timeout" (a Failed timeout: the
	// callee may hold it, counted apart from "Failed"), "ShuttingDown",
	// "Unavailable", "Ignored".
	ByVerdict map[string]int64 `json:"by_verdict"`
	// ForgedAnswers counts late verdicts and responses dropped because
	// they did not carry the token of the generation that accepted the
	// delivery (DESIGN §5): forgeries, or answers of another generation.
	ForgedAnswers int64 `json:"forged_answers"`
	// StaleAnswers counts late verdicts and responses dropped because
	// they came from a generation whose leg of the delivery this client
	// had given up on (it departed or moved with the leg in flight) and
	// answered resendable: the delivery was re-sent, and only the
	// acceptance this client took names who answers it (DESIGN §5); and
	// late refusals of an awaited Request set aside because its re-send
	// after a connection move was accepted again (the refusal may answer
	// the earlier acceptance only).
	StaleAnswers int64 `json:"stale_answers"`
	// LateVerdicts counts late verdicts that reached a Deliver after its
	// Accepted (see WithLateVerdicts).
	LateVerdicts int64 `json:"late_verdicts"`
	// Unmatched counts responses and late verdicts of Requests that matched
	// no pending call (it had timed out or failed already): counted and
	// dropped, never handed to another call.
	Unmatched int64 `json:"unmatched_answers"`
	// Resent counts re-sends (legs sent) of accepted Requests whose
	// response was awaited when their owner's connection moved (answered
	// by the owner's dedupe: the kept response again, or response-gone).
	Resent int64 `json:"resent_awaited"`
}

// Stats returns the client's counters.
func (c *Client) Stats() ClientStats {
	s := ClientStats{Accepted: c.accepted.Load(), Failed: c.failed.Load(), Retries: c.retries.Load(), ByVerdict: map[string]int64{},
		ForgedAnswers: c.forged.Load(), StaleAnswers: c.stale.Load(), LateVerdicts: c.lateVerdicts.Load(), Unmatched: c.unmatched.Load(), Resent: c.resent.Load()}
	for o := range c.byOutcome {
		s.ByVerdict[outcomeName(outcome(o))] = c.byOutcome[o].Load()
	}
	return s
}

// outcome is a delivery's final outcome as the counters record it: its
// verdict type, with timeouts apart.
type outcome uint8

const (
	outcomeTimeout = outcome(verdict.Ignored) + 1 + iota // Failed by a timeout: the callee may hold it
	numOutcomes
)

func outcomeName(o outcome) string {
	if o == outcomeTimeout {
		return "Timeout"
	}
	return verdict.ErrorType(o).String()
}

// count records how a delivery ended (its final outcome) and, unless start
// is zero (it failed validation), how long the call took.
func (c *Client) count(err error, start time.Time) {
	if err != nil {
		c.failed.Add(1)
	}
	o := outcome(verdict.Classify(err))
	if err != nil && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout)) && !errors.Is(err, context.Canceled) {
		o = outcomeTimeout
	}
	c.byOutcome[o].Add(1)
	if !start.IsZero() {
		c.latency[o].Observe(time.Since(start)) // real clock: a latency metric
	}
}

// Latencies returns, by final outcome (the keys of ClientStats.ByVerdict),
// the histogram of the time from a Deliver, DeliverAsync or Request call to
// its final outcome; calls that failed validation are not included.
func (c *Client) Latencies() map[string]histo.Snapshot {
	out := make(map[string]histo.Snapshot, numOutcomes)
	for o := range c.latency {
		out[outcomeName(outcome(o))] = c.latency[o].Snapshot()
	}
	return out
}
