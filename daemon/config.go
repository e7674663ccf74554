package daemon

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/hubs"
	"github.com/natsmesh/natsmesh/internal/natsurl"
	"github.com/natsmesh/natsmesh/mesh"
	"github.com/natsmesh/natsmesh/mesh/membership"
	"github.com/natsmesh/natsmesh/subjects"
)

// Defaults for zero Config fields.
const (
	DefaultListen       = "127.0.0.1:4222"
	DefaultDataDir      = "meshd-data"
	DefaultDrainTimeout = 30 * time.Second
)

// ErrInvalidConfig: a Config field is invalid.
var ErrInvalidConfig = errors.New("daemon: invalid config")

// Config holds a node process's settings. Name is required; every zero field
// means its documented default.
type Config struct {
	// Name is the node name, [A-Za-z0-9_-]{1,64}. Required.
	Name string
	// Prefix is the subject prefix; zero means subjects.DefaultPrefix.
	Prefix subjects.Prefix
	// Hubs are the kinds this node hosts, among the built-in kinds and
	// Kinds; nil means all of them.
	Hubs []string
	// Kinds are Go hub kinds of an embedding service, by kind name, in
	// addition to the built-in ones (package hubs).
	Kinds map[string]hub.Factory

	// NATSURL joins an external NATS cluster (comma-separated URLs,
	// checked before dialing: a malformed one is ErrInvalidConfig);
	// empty means run an embedded server.
	NATSURL string
	// Listen is the embedded server's client address; zero means
	// DefaultListen (loopback). Port 0 picks a free port.
	Listen string
	// LeafRemote makes the embedded server a leaf node of a hub cluster
	// (DESIGN §12): comma-separated leafnode URLs of the hub's servers
	// (nats-leaf://HOST:PORT, nats://, tls://, ws://, wss://; a
	// user:password in the URL is the leaf connection's login). The
	// server then runs without JetStream and binds the mesh account to the
	// hub's, with the hub's JetStream as the account's default domain, so
	// the node uses the hub's registry, directory, state and reminders;
	// the hub's servers need the same default_js_domain line and a
	// leafnodes listener (docs/operations.md, "Leaf nodes"). Empty: a
	// standalone embedded server. Not with NATSURL.
	LeafRemote string
	// LeafCreds is the credentials file of the leaf connection (the hub's
	// leafnode authorization); empty: the URL's login, if any.
	LeafCreds string
	// DataDir is the node's directory: the embedded server's JetStream
	// store, and the node's lock and holder record (LockFile, HolderFile).
	// The process holds an OS lock on it while it runs, so a second
	// process on the directory refuses to start (ErrDataDirInUse), and a
	// restart on the directory supersedes its own previous generation at
	// once instead of watching it for up to a TTL: the lock proves the
	// process that recorded it has exited (docs/operations.md,
	// "Restarts"). It must be local to the machine. Zero means
	// DefaultDataDir for an embedded server, and none on an external
	// cluster (no lock; a restart then waits to see whether the old
	// generation still heartbeats).
	DataDir string
	// Auth secures the embedded server with the three permission profiles
	// of package profiles (DESIGN §10): one nkey user each for nodes,
	// callers and operators, their seeds generated once into AuthDir
	// (EnsureAuthKeys); the node connects with the node seed. Without it
	// any local client can forge answers, advisories and registry
	// entries. Only for the embedded server: on an external cluster the
	// operator configures the users (docs/operations.md) and the node
	// connects with CredsFile, NKeyFile or User.
	Auth bool
	// AuthDir holds the generated seeds; zero means DataDir/auth.
	AuthDir string
	// InsecureListen lets the embedded server listen beyond loopback
	// without Auth. Without it, Run refuses such a Listen address.
	InsecureListen bool
	// Credentials for an external cluster, passed to nats.go: a
	// credentials file, an nkey seed file, or user and password.
	CredsFile, NKeyFile, User, Password string
	// TLS for an external cluster: client certificate and key, and a CA
	// file to verify the servers.
	TLSCert, TLSKey, TLSCA string

	// Standalone runs a one-node mesh without the registry and directory
	// (no JetStream needed). By default the node joins the membership:
	// generations from the registry, claims and placement through the
	// directory, prompt failure on departures.
	Standalone bool
	// KVReplicas is the replica count of the registry and directory
	// buckets (default 1; use 3 on a 3-server cluster).
	KVReplicas int
	// StateReplicas is the replica count of the durable hub state bucket
	// (file storage; mesh.MembershipConfig.StateReplicas); zero means
	// KVReplicas.
	StateReplicas int
	// KVCluster places the buckets and streams this node creates in the
	// NATS cluster of that name (mesh.MembershipConfig.PlacementCluster:
	// a supercluster's home cluster, DESIGN §12); empty: the server's
	// default, the creating node's cluster.
	KVCluster string
	// StateMaxValueSize is the largest state one address may save, in
	// bytes (mesh.MembershipConfig.StateMaxValueSize); zero means
	// hubstate.DefaultMaxValueSize.
	StateMaxValueSize int
	// Heartbeat and TTL tune departure detection by the registry (defaults
	// membership.DefaultHeartbeat and membership.DefaultTTL, 1 s and 8 s);
	// the disconnect advisory is faster where the account configuration
	// provides it (docs/operations.md).
	Heartbeat, TTL time.Duration
	// PlacementWait bounds how long a delivery to a kind no live node
	// hosts is retried (mesh.WithPlacementWait); zero means
	// mesh.DefaultPlacementWait.
	PlacementWait time.Duration
	// IdleTimeout is how long an activation with no work lives before it is
	// collected (hub.Config.IdleTimeout: its claim released, its state
	// saved, its next delivery activating it afresh); zero means
	// hub.DefaultIdleTimeout (5 min).
	IdleTimeout time.Duration
	// FencingDelay is how long survivors wait after a departure before
	// taking its addresses over; zero means
	// membership.DefaultFencingDelay.
	FencingDelay time.Duration
	// Replace lets this node supersede a live, still-heartbeating
	// generation of its name (meshd --replace). Without it a second
	// process with a live name fails at start, before writing to the
	// registry, with an error matching membership.ErrNameInUse.
	Replace bool
	// AdvisorySubject overrides where disconnect advisories are read;
	// zero means the embedded server's (AdvisorySubjectEmbedded), or on an
	// external server the advisory of the account the node's user is in
	// (membership.AccountAdvisorySubject), or membership.DefaultAdvisorySubject when
	// the server does not say.
	AdvisorySubject string

	// CallerIdentity says where the ingress takes an outside caller's
	// identity from (mesh.NodeConfig.CallerIdentity; SECURITY.md): zero is
	// mesh.CallerFromInbox (one account), mesh.CallerFromRequestInfo for
	// tenants in their own accounts that import the ingress.
	CallerIdentity mesh.CallerIdentity
	// IngressCallerRate, IngressCallerBurst and ClientInboxes are
	// mesh.NodeConfig's: a per-caller rate limit on the ingress (zero: no
	// limit) and the client users' inbox prefixes for the single-account
	// reply rules (SECURITY.md).
	IngressCallerRate  float64
	IngressCallerBurst int
	ClientInboxes      []string
	// DisableIngress: this node does not serve <prefix>.in.*.* (others
	// do). On by default.
	DisableIngress bool

	// HTTP is the address of /metrics, /healthz and /readyz; empty
	// disables the HTTP server.
	HTTP string
	// DrainTimeout bounds the drain on shutdown; zero means
	// DefaultDrainTimeout.
	DrainTimeout time.Duration
	// TracerProvider traces the node's deliveries, ingress, intakes and
	// turns (OpenTelemetry; docs/protocol.md §8c): an embedder's own
	// provider, which it also shuts down. nil with TracingFromEnv builds
	// one from the OTEL_* environment ([TracerProviderFromEnv]); nil
	// without it, the default, means no tracing.
	TracerProvider trace.TracerProvider
	// TracingFromEnv (meshd) configures tracing from the standard OTEL_*
	// environment when TracerProvider is nil; Run flushes and shuts that
	// provider down on exit.
	TracingFromEnv bool
	// Logger receives structured logs; nil means slog.Default().
	Logger *slog.Logger
	// Ready, if set, is called once the node serves.
	Ready func(Info)
}

func (c *Config) validate() error {
	if err := subjects.ValidateNodeName(c.Name); err != nil {
		return fmt.Errorf("%w: name: %w", ErrInvalidConfig, err)
	}
	if c.Prefix == "" {
		c.Prefix = subjects.DefaultPrefix
	}
	if err := c.Prefix.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if c.NATSURL != "" {
		if err := natsurl.Validate(c.NATSURL); err != nil {
			return fmt.Errorf("%w: NATSURL %q: %w", ErrInvalidConfig, c.NATSURL, err)
		}
	}
	if c.LeafRemote != "" {
		if c.NATSURL != "" {
			return fmt.Errorf("%w: LeafRemote (--leaf-remote) makes the embedded server a leaf node; NATSURL (--nats-url) joins an external cluster instead: give one", ErrInvalidConfig)
		}
		if c.Standalone {
			return fmt.Errorf("%w: a leaf node joins its hub's mesh: not with Standalone (--standalone)", ErrInvalidConfig)
		}
		if _, err := leafURLs(c.LeafRemote); err != nil {
			return fmt.Errorf("%w: LeafRemote (--leaf-remote): %w", ErrInvalidConfig, err)
		}
	}
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if err := checkAddr(c.Listen); err != nil {
		return fmt.Errorf("%w: listen: %w", ErrInvalidConfig, err)
	}
	if c.HTTP != "" {
		if err := checkAddr(c.HTTP); err != nil {
			return fmt.Errorf("%w: http: %w", ErrInvalidConfig, err)
		}
	}
	for _, f := range []struct {
		name  string // the field, and its meshd flag
		value int64
	}{
		{"DrainTimeout (--drain-timeout)", int64(c.DrainTimeout)},
		{"Heartbeat (--heartbeat)", int64(c.Heartbeat)},
		{"TTL (--ttl)", int64(c.TTL)},
		{"KVReplicas (--kv-replicas)", int64(c.KVReplicas)},
		{"StateReplicas (--state-replicas)", int64(c.StateReplicas)},
		{"StateMaxValueSize (--state-max-value)", int64(c.StateMaxValueSize)},
		{"PlacementWait (--placement-wait)", int64(c.PlacementWait)},
		{"IdleTimeout (--idle-timeout)", int64(c.IdleTimeout)},
		{"FencingDelay", int64(c.FencingDelay)},
	} {
		if f.value < 0 {
			return fmt.Errorf("%w: %s is negative", ErrInvalidConfig, f.name)
		}
	}
	if c.PlacementWait == 0 {
		c.PlacementWait = mesh.DefaultPlacementWait
	}
	hb, ttl := c.Heartbeat, c.TTL
	if hb == 0 {
		hb = membership.DefaultHeartbeat
	}
	if ttl == 0 {
		ttl = membership.DefaultTTL
	}
	if !c.Standalone && hb >= ttl {
		return fmt.Errorf("%w: the TTL (%v) must exceed the heartbeat (%v)", ErrInvalidConfig, ttl, hb)
	}
	if c.DataDir == "" && c.NATSURL == "" {
		c.DataDir = DefaultDataDir
	}
	if c.Auth && c.NATSURL != "" {
		return fmt.Errorf("%w: auth secures the embedded server; on an external cluster connect with credentials (creds, nkey, user) of the node profile", ErrInvalidConfig)
	}
	if c.Auth && c.AuthDir == "" {
		c.AuthDir = filepath.Join(c.DataDir, AuthDirName)
	}
	if c.NATSURL == "" && !c.Auth && !c.InsecureListen && !loopback(c.Listen) {
		return fmt.Errorf("%w: refusing to listen on %s without auth: any client that reaches it could forge answers, advisories and registry entries (use --auth, or --insecure-listen to allow it)", ErrInvalidConfig, c.Listen)
	}
	if c.DrainTimeout <= 0 {
		c.DrainTimeout = DefaultDrainTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		return fmt.Errorf("%w: a TLS client certificate needs both cert and key", ErrInvalidConfig)
	}
	return nil
}

// checkAddr validates a host:port listen address (port 0-65535).
func checkAddr(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 0 || p > 65535 {
		return fmt.Errorf("%q: port must be 0-65535", addr)
	}
	return nil
}

// kinds resolves the names of the hub kinds to host (validated before
// anything starts).
func (c *Config) kinds() ([]string, error) {
	all := map[string]bool{}
	for _, k := range hubs.Names() {
		all[k] = true
	}
	for k := range c.Kinds {
		all[k] = true
	}
	if c.Hubs == nil {
		return keys(all), nil
	}
	var out []string
	for _, k := range c.Hubs {
		k = strings.TrimSpace(k)
		if k == "" {
			continue
		}
		if !all[k] {
			return nil, fmt.Errorf("%w: unknown hub kind %q (known: %s)", ErrInvalidConfig, k, strings.Join(keys(all), ", "))
		}
		out = append(out, k)
	}
	slices.Sort(out)
	return out, nil
}

// factories returns the factory of each kind; the built-in ones send with
// the node's client.
func (c *Config) factories(node *mesh.Node, names []string) map[string]hub.Factory {
	all := hubs.Builtin(node.Client, c.Logger)
	for k, f := range c.Kinds {
		all[k] = f
	}
	out := map[string]hub.Factory{}
	for _, k := range names {
		out[k] = all[k]
	}
	return out
}
