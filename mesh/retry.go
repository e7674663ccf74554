package mesh

import (
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v5"
)

// RetryPolicy is the re-send ladder (DESIGN §4). Only failures for which
// verdict.IsResendable holds are retried; a timeout never is. The zero value
// of each field means the default in [DefaultRetryPolicy].
type RetryPolicy struct {
	// MaxRetries is how many times a delivery is re-sent after its first
	// attempt (default 6: 7 attempts). Negative means no retry.
	MaxRetries int
	// Initial is the first back-off (default 250 ms).
	Initial time.Duration
	// Max caps each back-off (default 3 s).
	Max time.Duration
	// Multiplier grows the back-off (default 2).
	Multiplier float64
	// Jitter randomizes each back-off by ±Jitter of its value (default
	// 0.2); it de-synchronises senders that failed together.
	Jitter float64
}

// DefaultRetryPolicy is 6 retries from 250 ms doubling to a 3 s cap with ±20 %
// jitter: 0.25+0.5+1+2+3+3 = 9.75 s of back-off in all, sized for refusals,
// which arrive at once (DESIGN §4).
var DefaultRetryPolicy = RetryPolicy{MaxRetries: 6, Initial: 250 * time.Millisecond, Max: 3 * time.Second, Multiplier: 2, Jitter: 0.2}

func (p RetryPolicy) withDefaults() (RetryPolicy, error) {
	d := DefaultRetryPolicy
	if p.MaxRetries == 0 {
		p.MaxRetries = d.MaxRetries
	}
	if p.MaxRetries < 0 {
		p.MaxRetries = 0
	}
	if p.Initial == 0 {
		p.Initial = d.Initial
	}
	if p.Max == 0 {
		p.Max = d.Max
	}
	if p.Multiplier == 0 {
		p.Multiplier = d.Multiplier
	}
	if p.Jitter == 0 {
		p.Jitter = d.Jitter
	}
	if p.Initial < 0 || p.Max < p.Initial || p.Multiplier < 1 || p.Jitter < 0 || p.Jitter >= 1 {
		return p, fmt.Errorf("%w: retry policy %+v", ErrInvalidConfig, p)
	}
	return p, nil
}

// backoff returns the policy's back-off sequence for one delivery.
func (p RetryPolicy) backoff() *backoff.ExponentialBackOff {
	return &backoff.ExponentialBackOff{
		InitialInterval:     p.Initial,
		RandomizationFactor: p.Jitter,
		Multiplier:          p.Multiplier,
		MaxInterval:         p.Max,
	}
}
