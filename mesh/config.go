package mesh

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/trace"

	"github.com/natsmesh/natsmesh/internal/clock"
	"github.com/natsmesh/natsmesh/subjects"
)

// Config holds a Client's required settings; optional ones are [Option]s.
type Config struct {
	// Conn is the NATS connection deliveries travel on. Required.
	Conn *nats.Conn
	// Resolver maps an address to its owner node. Required.
	Resolver Resolver
	// Identity names this sender: it names its answer subject
	// <prefix>.ans.<name>.<gen>, from which hubs read the sender's
	// identity. Zero means a fresh identity "client-<random>" with the
	// start time as generation.
	Identity subjects.NodeID
	// Prefix is the subject prefix; zero means subjects.DefaultPrefix.
	Prefix subjects.Prefix
}

func (c *Config) validate() error {
	if c.Conn == nil {
		return fmt.Errorf("%w: Conn is nil", ErrInvalidConfig)
	}
	if c.Resolver == nil {
		return fmt.Errorf("%w: Resolver is nil", ErrInvalidConfig)
	}
	if c.Identity.IsZero() {
		c.Identity = subjects.NodeID{Name: "client-" + nuidShort(), Generation: uint64(time.Now().UnixNano())} // real clock: on the wire
	}
	if err := c.Identity.Validate(); err != nil {
		return fmt.Errorf("%w: Identity: %w", ErrInvalidConfig, err)
	}
	if c.Prefix == "" {
		c.Prefix = subjects.DefaultPrefix
	}
	if err := c.Prefix.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return nil
}

// LateVerdict is a failure that reached a delivery after it was Accepted
// (its hub's build failed: Unavailable; it was deactivated before handling:
// ShuttingDown). It replaces the Accepted verdict; a delivery gets at most one.
type LateVerdict struct {
	ID  string
	Err error // a *verdict.Error
}

// Option sets an optional Client setting.
type Option func(*options) error

type options struct {
	maxInFlight         int
	window              int // a lane's window until its receiver grants one
	windowCap           int // the most a grant raises it to
	saturationThreshold int
	legTimeout          time.Duration
	requestTimeout      time.Duration
	placementWait       time.Duration
	retry               RetryPolicy
	clock               Clock
	logger              *slog.Logger
	onLate              func(LateVerdict)
	tracer              trace.Tracer // nil: tracing off
	view                ClusterView
}

// Defaults for the options.
const (
	// DefaultLegTimeout bounds one leg (one request for one attempt) when
	// ctx has no earlier deadline. Hubs answer on acceptance, so a leg
	// that takes this long means a starved or partitioned intake.
	DefaultLegTimeout = 5 * time.Second
	// DefaultRequestTimeout bounds Request (acceptance plus response) and
	// Deliver when ctx has no deadline.
	DefaultRequestTimeout = 30 * time.Second
	// DefaultPlacementWait is how long a delivery whose kind no live node
	// hosts is retried before it fails Unavailable (verdict.ErrNoPlacement).
	DefaultPlacementWait = time.Second
)

func defaultOptions() options {
	return options{
		maxInFlight:         DefaultMaxInFlight,
		window:              DefaultWindow,
		windowCap:           MaxGrantedWindow,
		saturationThreshold: DefaultSaturationThreshold,
		legTimeout:          DefaultLegTimeout,
		requestTimeout:      DefaultRequestTimeout,
		placementWait:       DefaultPlacementWait,
		retry:               DefaultRetryPolicy,
		clock:               clock.Real(),
		logger:              slog.Default(),
	}
}

// WithMaxInFlight caps legs in flight across the client (default 256). A
// slot is charged from the moment a leg is sent until its reply; callers
// beyond the cap wait, bounded by their ctx.
func WithMaxInFlight(n int) Option {
	return func(o *options) error {
		if n < 1 {
			return fmt.Errorf("%w: max in flight %d < 1", ErrInvalidConfig, n)
		}
		o.maxInFlight = n
		return nil
	}
}

// WithWindow fixes how many legs of one lane may be in flight at once; 1
// is stop-and-wait. Without it a lane starts with [DefaultWindow] (32) and
// then takes the window its receiver grants (hub.HeaderWindow: what the
// activation's inbox has room for, 256 by default), at most
// [MaxGrantedWindow]; with it a grant may lower the window, never raise it
// above n. Order within a lane is kept either way (DESIGN §4). Errors match
// [ErrInvalidConfig] for n < 1.
func WithWindow(n int) Option {
	return func(o *options) error {
		if n < 1 {
			return fmt.Errorf("%w: window %d < 1", ErrInvalidConfig, n)
		}
		o.window, o.windowCap = n, n
		return nil
	}
}

// WithSaturationThreshold sets the legs in flight that open a saturation
// episode (default 64); 0 disables the report's log line.
func WithSaturationThreshold(n int) Option {
	return func(o *options) error {
		if n < 0 {
			return fmt.Errorf("%w: saturation threshold %d < 0", ErrInvalidConfig, n)
		}
		o.saturationThreshold = n
		return nil
	}
}

// WithLegTimeout bounds each leg (default 5 s).
func WithLegTimeout(d time.Duration) Option {
	return func(o *options) error {
		if d <= 0 {
			return fmt.Errorf("%w: leg timeout %v", ErrInvalidConfig, d)
		}
		o.legTimeout = d
		return nil
	}
}

// WithRequestTimeout bounds a Deliver or Request whose ctx has no deadline
// (default 30 s).
func WithRequestTimeout(d time.Duration) Option {
	return func(o *options) error {
		if d <= 0 {
			return fmt.Errorf("%w: request timeout %v", ErrInvalidConfig, d)
		}
		o.requestTimeout = d
		return nil
	}
}

// WithPlacementWait bounds how long a delivery to an address whose kind no
// live node hosts keeps being retried (default 1 s) before it fails with
// verdict.ErrNoPlacement (Unavailable, resendable: nothing was sent). A node
// hosting the kind that joins meanwhile gets the delivery. It is shorter
// than the retry ladder so that a typo in a kind answers within about a
// second; 0 fails at the first attempt.
func WithPlacementWait(d time.Duration) Option {
	return func(o *options) error {
		if d < 0 {
			return fmt.Errorf("%w: placement wait %v", ErrInvalidConfig, d)
		}
		o.placementWait = d
		return nil
	}
}

// WithRetry sets the re-send ladder; zero fields take their defaults.
func WithRetry(p RetryPolicy) Option {
	return func(o *options) error {
		p, err := p.withDefaults()
		o.retry = p
		return err
	}
}

// WithClock sets the clock the client's timers run on (see [Clock]): the
// retry ladder's back-offs and placement wait, a re-sent Request's waits.
// Given to [NewNode], it is the node's one clock, threaded to its hub host,
// membership, directory, reminder runner and sync streams too. Nil (the
// default) means the real clock. Deadlines stay on the real clock.
func WithClock(c Clock) Option {
	return func(o *options) error {
		o.clock = clock.Or(c)
		return nil
	}
}

// WithLogger sets the structured logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option {
	return func(o *options) error {
		if l == nil {
			return fmt.Errorf("%w: nil logger", ErrInvalidConfig)
		}
		o.logger = l
		return nil
	}
}

// WithLateVerdicts registers f to receive late verdicts of deliveries made
// with Deliver (a Request gets its own as its error). f runs on the client's
// answer-dispatch goroutine, one call at a time, never under a client lock; it
// must not block for long. The late verdict and the Accepted reply travel
// separately, so f may run before the Deliver that was accepted returns.
func WithLateVerdicts(f func(LateVerdict)) Option {
	return func(o *options) error {
		o.onLate = f
		return nil
	}
}

// WithView sets the cluster view the client reads liveness from (DESIGN
// §9): before each attempt it asks whether the owner generation it
// addresses is gone, and if so fails the attempt at once with the
// resendable departed verdict instead of sending. The client keeps no
// liveness of its own. A [Node] with membership passes its view (the
// current session's membership, followed across rejoins); a standalone
// client has membership.Static by default, which sees no departure (see
// [NewClient]). v must be safe for concurrent use and cheap.
func WithView(v ClusterView) Option {
	return func(o *options) error {
		if v == nil {
			return fmt.Errorf("%w: nil cluster view", ErrInvalidConfig)
		}
		o.view = v
		return nil
	}
}
