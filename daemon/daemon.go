// Package daemon runs one mesh node as a process (DESIGN §8): on an embedded
// NATS server with JetStream by default, or joined to an external NATS
// cluster; with Prometheus /metrics, /healthz and /readyz over HTTP, structured
// logs, the ingress and the control service; and a drain with a deadline on
// shutdown. cmd/meshd is flags over this package, and a Go service can embed
// it to run a node with its own hub kinds (Config.Kinds).
package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
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

// Info describes a running node.
type Info struct {
	Node     subjects.NodeID
	NATSURL  string // the client URL of the NATS server the node uses
	Embedded bool   // the server runs in this process
	HTTPAddr string // the bound HTTP address, or ""
	Kinds    []string
	// Mesh is the running node, for a program that embeds the daemon and
	// reads its session (e.g. the test node's claim checks); the daemon
	// owns it: do not Close or Drain it.
	Mesh *mesh.Node
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

// Run starts the node and blocks until ctx ends or a drain is requested over
// the control subject; then it drains within DrainTimeout (new deliveries are
// refused ShuttingDown, accepted ones are settled), drains the NATS
// connection and stops the embedded server. It returns nil after a clean
// drain, the drain's error if the deadline cut it short, or the start-up
// error (invalid config, NATS unreachable, port in use).
func Run(ctx context.Context, cfg Config) (runErr error) {
	if err := cfg.validate(); err != nil {
		return err
	}
	kinds, err := cfg.kinds()
	if err != nil {
		return err
	}
	log := cfg.Logger
	info := Info{Kinds: kinds}
	tp := cfg.TracerProvider
	if tp == nil && cfg.TracingFromEnv {
		sdk, err := TracerProviderFromEnv(ctx, cfg.Name)
		if err != nil {
			return err
		}
		if sdk != nil {
			tp = sdk
			log.Info("tracing on: exporting spans as the OTEL_* environment says", "exporter", os.Getenv("OTEL_TRACES_EXPORTER"), "protocol", os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL"))
			defer func() {
				sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				if err := sdk.Shutdown(sctx); err != nil {
					log.Warn("tracing: spans not flushed", "err", err)
				}
			}()
		}
	}

	// The data directory's lock first: a second process on it must not
	// start anything (its embedded server would share the store), and
	// the lock proves this directory's previous holders gone.
	var dd *dataDir
	if cfg.DataDir != "" {
		dd, err = openDataDir(cfg.DataDir, cfg.Name, cfg.Prefix, log)
		if err != nil {
			return err
		}
		defer func() {
			// How this run ended, for meshd drain, before the lock goes.
			dd.RecordExit(runErr)
			_ = dd.Close()
		}()
	}
	var ns *server.Server
	url := cfg.NATSURL
	if url == "" {
		ns, err = startEmbedded(&cfg)
		if err != nil {
			return err
		}
		defer func() {
			ns.Shutdown()
			ns.WaitForShutdown()
		}()
		url, info.Embedded = ns.ClientURL(), true
		if cfg.AdvisorySubject == "" {
			cfg.AdvisorySubject = AdvisorySubjectEmbedded
		}
		if cfg.LeafRemote != "" {
			log.Info("embedded NATS server running as a leaf node", "url", url, "hub", redactURLs(cfg.LeafRemote), "auth", cfg.Auth)
		} else {
			log.Info("embedded NATS server running", "url", url, "jetstream_dir", cfg.DataDir, "auth", cfg.Auth)
		}
		if cfg.Auth {
			log.Info("auth on: nkey seeds of the permission profiles", "dir", cfg.AuthDir,
				"node", NodeSeedFile, "client", ClientSeedFile, "operator", OperatorSeedFile)
		}
	}
	// A server announcing lame duck mode (a rolling restart) gets the
	// node's connection moved off it before it closes it.
	var nodeRef atomic.Pointer[mesh.Node]
	nc, err := connect(cfg, url, mesh.LameDuckHandler(&nodeRef))
	if err != nil {
		return err
	}
	defer nc.Close()
	info.NATSURL = nc.ConnectedUrlRedacted()

	if !cfg.Standalone {
		if err := checkJetStream(ctx, nc); err != nil {
			return err
		}
		if cfg.AdvisorySubject == "" {
			// The advisory of the account this node is in, which the
			// node profile allows (not the wildcard it refuses).
			adv, err := membership.AccountAdvisorySubject(ctx, nc)
			if err != nil {
				adv = membership.DefaultAdvisorySubject
				log.Warn("disconnect advisories: the server did not say which account this node is in; listening on the wildcard (refused by the node profile: departures are then detected by the registry TTL only)", "subject", adv, "err", err)
			}
			cfg.AdvisorySubject = adv
			log.Info("disconnect advisories: listening (checked once joined)", "subject", adv)
		}
	}

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	met := newDepartureMetrics()
	var fatal atomic.Pointer[error]
	ncfg := mesh.NodeConfig{
		Conn: nc, Name: cfg.Name, Prefix: cfg.Prefix, Logger: log, TracerProvider: tp,
		Host: hub.Config{IdleTimeout: cfg.IdleTimeout},
		OnDrainRequest: func() {
			log.Info("drain requested over the control subject")
			stop()
		},
		OnMembershipEvent: met.observe,
		DisableIngress:    cfg.DisableIngress,
		CallerIdentity:    cfg.CallerIdentity,
		IngressCallerRate: cfg.IngressCallerRate, IngressCallerBurst: cfg.IngressCallerBurst,
		ClientInboxes: cfg.ClientInboxes,
		OnFatal: func(err error) {
			log.Error("node cannot go on", "err", err)
			fatal.Store(&err)
			stop()
		},
	}
	if !cfg.Standalone {
		ncfg.Membership = &mesh.MembershipConfig{
			Heartbeat: cfg.Heartbeat, TTL: cfg.TTL, FencingDelay: cfg.FencingDelay, Replicas: cfg.KVReplicas,
			StateReplicas: cfg.StateReplicas, StateMaxValueSize: cfg.StateMaxValueSize, PlacementCluster: cfg.KVCluster,
			AdvisorySubject: cfg.AdvisorySubject, Replace: cfg.Replace,
		}
		if dd != nil {
			ncfg.Membership.Predecessors = dd.Predecessors()
			ncfg.Membership.OnGeneration = dd.Record
			if p := ncfg.Membership.Predecessors; len(p) > 0 {
				log.Info("this data directory's previous holder has exited (its lock was free): a registered generation it recorded is superseded at once",
					"dir", cfg.DataDir, "generations", len(p), "newest", p[len(p)-1])
			}
		}
	}
	node, err := mesh.NewNode(ncfg, mesh.WithPlacementWait(cfg.PlacementWait))
	if err != nil {
		return err
	}
	nodeRef.Store(node)
	for k, f := range cfg.factories(node, kinds) {
		if err := node.Register(k, f); err != nil {
			return err
		}
	}
	// Bind every port before joining (a node that cannot serve must not
	// announce itself, nor supersede anything).
	var httpLn net.Listener
	if cfg.HTTP != "" {
		httpLn, err = net.Listen("tcp", cfg.HTTP)
		if err != nil {
			return fmt.Errorf("daemon: http: %w", err)
		}
		defer httpLn.Close()
		info.HTTPAddr = httpLn.Addr().String()
	}
	// HTTP answers from the moment its port is bound: while the node
	// joins (which may wait up to a TTL for a registered generation of
	// its name), /healthz says the process is alive and /readyz and
	// /metrics answer 503 "starting" — before, they did not answer at all
	// until the join returned (a fresh-user trial: curl hung 8 s).
	var ready atomic.Bool
	var httpSrv *http.Server
	var served atomic.Pointer[http.Handler]
	if httpLn != nil {
		ln := httpLn
		starting := startingHandler()
		served.Store(&starting)
		httpSrv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { (*served.Load()).ServeHTTP(w, r) }),
			ReadHeaderTimeout: 5 * time.Second}
		go func() {
			if err := httpSrv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, net.ErrClosed) {
				log.Error("http server failed", "err", err)
			}
		}()
		defer httpSrv.Close()
	}
	if !cfg.Standalone {
		log.Info("joining the mesh", "name", cfg.Name, "nats", info.NATSURL)
	}
	if err := node.Start(); err != nil {
		if errors.Is(err, membership.ErrNameInUse) {
			return fmt.Errorf("daemon: %w", err)
		}
		if !cfg.Standalone && (errors.Is(err, nats.ErrTimeout) || errors.Is(err, jetstream.ErrJetStreamNotEnabled) || errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount)) {
			return fmt.Errorf("daemon: start node: %w (the membership needs JetStream on the NATS account; or run standalone)", err)
		}
		return fmt.Errorf("daemon: start node: %w", err)
	}
	info.Node, info.Mesh = node.ID(), node

	if httpSrv != nil {
		h := handler(node, nc, &ready, met)
		served.Store(&h)
	}
	ready.Store(true)
	log.Info("meshd node serving", "node", node.ID().String(), "nats", info.NATSURL, "kinds", strings.Join(info.Kinds, ","), "http", info.HTTPAddr, "prefix", string(cfg.Prefix))
	if cfg.Ready != nil {
		cfg.Ready(info)
	}
	if !cfg.Standalone && cfg.AdvisorySubject != "-" {
		ttl := membership.DefaultTTL
		if m := node.Members(); m != nil {
			ttl = m.TTL() // the registry's, which the node follows
		}
		probed := make(chan struct{})
		defer func() { <-probed }()
		go func() {
			defer close(probed)
			probeAdvisories(runCtx, cfg, url, nc, ttl, met)
		}()
	}

	<-runCtx.Done()
	ready.Store(false)
	log.Info("draining", "deadline", cfg.DrainTimeout.String())
	dctx, cancel := context.WithTimeout(context.Background(), cfg.DrainTimeout)
	defer cancel()
	derr := node.Drain(dctx)
	if err := nc.Drain(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
		log.Warn("NATS drain", "err", err)
		if derr == nil {
			derr = fmt.Errorf("NATS connection drain: %w", err)
		}
	}
	for nc.IsDraining() && dctx.Err() == nil {
		time.Sleep(5 * time.Millisecond)
	}
	if nc.IsDraining() && derr == nil {
		derr = fmt.Errorf("NATS connection drain: %w", dctx.Err())
	}
	if httpSrv != nil {
		_ = httpSrv.Shutdown(dctx)
	}
	if ferr := fatal.Load(); ferr != nil {
		return *ferr
	}
	if derr != nil {
		log.Warn("drain cut short by its deadline", "err", derr)
		return fmt.Errorf("daemon: drain: %w", derr)
	}
	log.Info("drained")
	return nil
}

// ErrNotPermitted: the server took the node's login but its user may not
// do what a node does (the JetStream API, the mesh's subjects): the
// credentials are another profile's (SECURITY.md). A start that failed,
// as a refused login is — not bad input to meshd.
var ErrNotPermitted = errors.New("daemon: the NATS user is not permitted")

// ErrNoJetStream: the NATS account has no JetStream, which the membership
// needs.
var ErrNoJetStream = errors.New("daemon: no JetStream on the NATS account")

// jetStreamWait bounds how long a start waits for JetStream to answer (a
// cluster that just formed may have no meta leader for a moment).
const jetStreamWait = 10 * time.Second

// startingHandler serves while the node joins: /healthz 200 (the process
// is alive: a liveness probe must not restart a node waiting out its
// name's TTL), /readyz and /metrics 503.
func startingHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok (starting)") })
	notYet := func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "not ready (starting: joining the mesh)", http.StatusServiceUnavailable)
	}
	mux.HandleFunc("/readyz", notYet)
	mux.HandleFunc("/metrics", notYet)
	return mux
}

// handler serves /metrics, /healthz and /readyz.
func handler(node *mesh.Node, nc *nats.Conn, ready *atomic.Bool, met *departureMetrics) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), newCollector(node, nc), met.events, met.latency, met.advisories)
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{EnableOpenMetrics: true}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if nc.IsClosed() {
			http.Error(w, "NATS connection closed", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		switch {
		case !ready.Load():
			http.Error(w, "not ready (starting or draining)", http.StatusServiceUnavailable)
		case !nc.IsConnected():
			http.Error(w, "NATS "+nc.Status().String(), http.StatusServiceUnavailable)
		default:
			fmt.Fprintln(w, "ready")
		}
	})
	return mux
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
