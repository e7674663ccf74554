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
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/mesh"
	"github.com/natsmesh/natsmesh/mesh/membership"
	"github.com/natsmesh/natsmesh/subjects"
)

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
