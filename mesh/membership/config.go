package membership

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/internal/clock"
	"github.com/natsmesh/natsmesh/subjects"
)

// Config holds the membership settings. Conn and Name are required; zero
// fields mean their documented defaults.
type Config struct {
	// Conn is the node's NATS connection; its name should be
	// ConnName(Self) for advisories to identify it, its ping settings
	// ClientPingInterval and ClientMaxPingsOut.
	Conn *nats.Conn
	// Prefix names the buckets; zero means subjects.DefaultPrefix.
	Prefix subjects.Prefix
	// Name is the node name. Required.
	Name string
	// Kinds are the hub kinds the node hosts.
	Kinds []string
	// Version is the software version the node announces.
	Version string
	// Subscriber registers the process as a subscriber, not a node
	// (Member.Subscriber).
	Subscriber bool
	// Heartbeat is how often the entry is refreshed (default 1 s).
	Heartbeat time.Duration
	// TTL declares a generation gone after this much heartbeat silence
	// while the registry took writes (default 8 s). The first node to
	// create the registry sets it for the mesh; later nodes follow it.
	TTL time.Duration
	// FencingDelay is how long after a generation's departure survivors
	// wait before taking its addresses over (default 2 s); it must cover
	// the client ping bound of the departed node's connection.
	FencingDelay time.Duration
	// Replicas of the KV buckets (default 1; use 3 on a 3-server cluster).
	Replicas int
	// PlacementCluster, if set, places the registry bucket this node
	// creates in the NATS cluster of that name (a supercluster's home
	// cluster, DESIGN §12); empty leaves it to the server, which puts a
	// new stream in the requesting client's cluster. An existing bucket is
	// used where it is.
	PlacementCluster string
	// AdvisorySubject receives client-disconnect advisories; zero means
	// DefaultAdvisorySubject, "-" disables listening.
	AdvisorySubject string
	// Replace lets this process supersede a live, still-heartbeating
	// generation of its name (a deliberate takeover). Without it Join
	// returns ErrNameInUse before writing anything.
	Replace bool
	// Rejoin is the generation of this process that lost its
	// registration (declared gone: frozen, partitioned) and whose
	// activations the process has dropped: Join, without Replace, then
	// supersedes that generation at once if it is still registered, and
	// judges any other registered generation of the name as a new process
	// would — one that still heartbeats is ErrNameInUse (a newer process
	// took the name while this one was gone, and this one must stand
	// down, not take the name back). While it judges an older generation
	// (a first read served by a replica that lags), a read of its own lost
	// generation supersedes that one. Zero for a first join.
	Rejoin subjects.NodeID
	// Predecessors are generations of this node's name whose processes
	// are proven to have exited: meshd recorded them in its data
	// directory, and holding that directory's OS lock now proves the
	// processes that held it gone (docs/operations.md, "Restarts"). A
	// registered generation among them is superseded at once: Join does
	// not wait to see whether it still heartbeats (as it does for any
	// other registered generation without Replace), and the new entry
	// names it (Member.Supersedes) so that survivors take its addresses
	// over without the fencing delay. Only a caller that can prove it may
	// set this: naming a live generation here lets two processes serve.
	Predecessors []uint64
	// BeforeAnnounce, if set, is called with the generation Join is about
	// to write, before it is written: the node subscribes its delivery
	// subject there, so a sender that reads the new generation never meets
	// no responders (join order). If the write then loses a race, undo is
	// called and BeforeAnnounce again with another generation.
	BeforeAnnounce func(subjects.NodeID) (undo func(), err error)
	// Logger; nil means slog.Default().
	Logger *slog.Logger
	Clock  clock.Clock // heartbeats, expiry, lease, departures, takeovers; nil: real (registry times stay real)

	// nameRead, when set (tests), replaces readEntry in the check of a
	// registered name (checkName): replicas that answer differently.
	nameRead func(context.Context, string) (Member, uint64, error)
}

func (c *Config) validate() error {
	if c.Conn == nil {
		return fmt.Errorf("%w: Conn is nil", ErrInvalidConfig)
	}
	if err := subjects.ValidateNodeName(c.Name); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if c.Prefix == "" {
		c.Prefix = subjects.DefaultPrefix
	}
	if c.Heartbeat <= 0 {
		c.Heartbeat = DefaultHeartbeat
	}
	if c.TTL <= 0 {
		c.TTL = DefaultTTL
	}
	if c.FencingDelay <= 0 {
		c.FencingDelay = DefaultFencingDelay
	}
	if c.TTL <= c.Heartbeat {
		return fmt.Errorf("%w: TTL %v must exceed the heartbeat %v", ErrInvalidConfig, c.TTL, c.Heartbeat)
	}
	if c.Replicas <= 0 {
		c.Replicas = 1
	}
	if c.AdvisorySubject == "" {
		c.AdvisorySubject = DefaultAdvisorySubject
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	c.Clock = clock.Or(c.Clock)
	return nil
}
