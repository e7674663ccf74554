package verdict_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/verdict"
)

// The verdict switch: what a sender does with the error of a delivery.
// Check the narrowest predicate first.
func Example() {
	for _, err := range []error{
		nil,
		fmt.Errorf("deliver: %w", verdict.ErrNoPlacement),
		fmt.Errorf("deliver: %w", verdict.ErrHubShuttingDown),
		fmt.Errorf("deliver: leg: %w", nats.ErrTimeout),
		fmt.Errorf("deliver: %w", verdict.ErrInboxFull),
		fmt.Errorf("deliver: %w", verdict.ErrHandler),
		fmt.Errorf("deliver: %w", context.Canceled),
	} {
		var what string
		switch {
		case err == nil:
			what = "Accepted: the hub holds it"
		case verdict.IsResendable(err):
			what = "the hub holds nothing: safe to send again"
		case verdict.IsTransient(err):
			what = "outcome unknown: the hub MAY hold it; never re-send blindly"
		default:
			what = "terminal: do not send it again"
		}
		reason := "-"
		if r := verdict.ReasonOf(err); r != verdict.ReasonUnknown {
			reason = r.String()
		} else if errors.Is(err, nats.ErrTimeout) {
			reason = "timeout"
		} else if errors.Is(err, context.Canceled) {
			reason = "cancelled"
		}
		fmt.Printf("%-12s %-15s %s\n", verdict.Classify(err), reason, what)
	}
	// Output:
	// Accepted     -               Accepted: the hub holds it
	// Unavailable  no-placement    the hub holds nothing: safe to send again
	// ShuttingDown shutting-down   the hub holds nothing: safe to send again
	// Failed       timeout         outcome unknown: the hub MAY hold it; never re-send blindly
	// Ignored      inbox-full      terminal: do not send it again
	// Failed       handler-error   terminal: do not send it again
	// Failed       cancelled       terminal: do not send it again
}
