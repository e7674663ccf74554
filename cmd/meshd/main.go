// Command meshd runs one natsmesh node: on an embedded NATS server with
// JetStream by default, or joined to an external NATS cluster with
// --nats-url. SIGTERM or SIGINT drains within --drain-timeout; a second
// signal exits at once.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/natsmesh/natsmesh/daemon"
	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/hubs"
	"github.com/natsmesh/natsmesh/internal/buildinfo"
	"github.com/natsmesh/natsmesh/internal/envflag"
	"github.com/natsmesh/natsmesh/internal/natsauth"
	"github.com/natsmesh/natsmesh/internal/natsurl"
	"github.com/natsmesh/natsmesh/mesh"
	"github.com/natsmesh/natsmesh/mesh/membership"
	"github.com/natsmesh/natsmesh/subjects"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr, nil))
}

// The registry's defaults, for the heartbeat and TTL flags.
const (
	defaultHeartbeat = membership.DefaultHeartbeat
	defaultTTL       = membership.DefaultTTL
)

// options are meshd's flags.
type options struct {
	name, prefix, hubs, natsURL, listen, dataDir        string
	creds, nkey, user, password, tlsCert, tlsKey, tlsCA string
	http, logFormat, logLevel, callerIdentity           string
	drainTimeout, heartbeat, ttl, placementWait, idle   time.Duration
	standalone, auth, insecureListen                    bool
	authDir                                             string
	replace                                             bool
	dataDirSet                                          bool // --data-dir (or MESHD_DATA_DIR) given
	kvReplicas                                          int
	kvCluster, leafRemote, leafCreds                    string
	stateReplicas, stateMaxValue                        int
	callerRate, clientInboxes                           string
	callerBurst                                         int

	env *envflag.Set // where each flag's value came from
}

// defaultName is the host name, cut to a valid node name.
func defaultName() string {
	h, _ := os.Hostname()
	var b strings.Builder
	for _, r := range h {
		if r < 128 && (r == '-' || r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
			b.WriteRune(r)
		}
		if b.Len() == 64 {
			break
		}
	}
	if b.Len() == 0 {
		return "meshd"
	}
	return b.String()
}

// newRootCmd builds the meshd command. ready, if set, receives the running
// node's Info (tests use it).
func newRootCmd(stdout, stderr io.Writer, ready func(daemon.Info)) *cobra.Command {
	var o options
	cmd := &cobra.Command{
		Use:   "meshd",
		Short: "Run a natsmesh node",
		Long: `meshd runs one natsmesh node.

By default it starts an embedded NATS server (JetStream on, loopback only,
store in --data-dir) and prints its client URL; --nats-url joins an external
NATS cluster instead. The node hosts the hub kinds in --hubs, serves the
ingress (<prefix>.in.<addr>.<stream>) for any NATS client, registers as the
NATS micro service "natsmesh", and serves Prometheus /metrics, /healthz and
/readyz on --http.

SIGTERM or SIGINT drains: new deliveries are refused ShuttingDown, accepted
ones are settled, then the NATS connection drains; --drain-timeout bounds
it. A second signal exits at once.

Every flag can also be set by the environment variable in its help text
(MESHD_ and the flag's name in capitals, e.g. MESHD_DRAIN_TIMEOUT=10s); the
command line wins. A value the flag would reject is an error naming the
variable: durations need a unit (10s, not 10) and are not negative, booleans
are true or false, the credential and TLS files are read and checked before
connecting. So are errors about two settings together (the TTL not above the
heartbeat) and a port in use or a data directory that cannot be made.

Tracing (OpenTelemetry) is off unless the standard OTEL_* environment asks
for it: OTEL_TRACES_EXPORTER=otlp (or console), or an OTLP endpoint
(OTEL_EXPORTER_OTLP_ENDPOINT); OTEL_EXPORTER_OTLP_PROTOCOL is grpc or
http/protobuf; OTEL_SERVICE_NAME (default meshd), OTEL_TRACES_SAMPLER and
OTEL_BSP_* apply. An invalid value is a configuration error.

Exit codes: 0 after a clean drain; 1 bad usage or configuration (unknown
flag, invalid name, address or duration, malformed NATS URL, invalid
environment value, unknown hub kind); 2 the node could not start (port in
use, its --data-dir held by another meshd, NATS unreachable, the login refused: the line says which credentials
to give, a user without the node profile's permissions, no JetStream for the membership), its drain was cut short by
--drain-timeout, or a newer incarnation of its name took over; 130 a second
signal during the drain.`,
		Version:       buildinfo.Read().String(),
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return serve(cmd.Context(), o, stdout, stderr, ready)
		},
	}
	f := cmd.Flags()
	o.name, o.prefix = defaultName(), string(subjects.DefaultPrefix)
	f.Var(checked(&o.name, subjects.ValidateNodeName), "name", "node name, [A-Za-z0-9_-]{1,64}; the default is the host name")
	f.Var(checked(&o.prefix, func(v string) error { return subjects.Prefix(v).Validate() }), "prefix", "subject prefix")
	o.hubs = strings.Join(hubs.Names(), ",")
	f.Var(checked(&o.hubs, checkKinds), "hubs", "comma-separated hub kinds to host")
	f.Var(checked(&o.natsURL, optional(natsurl.Validate)), "nats-url", "join this external NATS cluster instead of running an embedded server; comma-separated URLs (nats://HOST:PORT, tls://, ws://, wss://)")
	o.listen, o.dataDir = daemon.DefaultListen, daemon.DefaultDataDir
	f.Var(checked(&o.listen, checkAddr), "listen", "embedded NATS server client address")
	f.Var(checked(&o.leafRemote, optional(daemon.ValidateLeafRemote)), "leaf-remote", "make the embedded NATS server a leaf node of this hub cluster (comma-separated leafnode URLs, nats-leaf://HOST:PORT; a user:password in the URL logs in): no JetStream of its own, the mesh account bound to the hub's, the node in the hub's mesh (docs/operations.md, Leaf nodes)")
	f.Var(checked(&o.leafCreds, optional(natsauth.CheckCreds)), "leaf-creds", "credentials file of the --leaf-remote connection")
	f.Var(checked(&o.dataDir, checkDir), "data-dir", "the node's directory: the embedded NATS server's JetStream store, and the node's lock and holder record; meshd holds an OS lock on it (a second meshd on it exits 2), and a restart on it supersedes its own crashed generation at once (docs/operations.md, Restarts). Must be local to the machine. With --nats-url it is used only when set")
	f.BoolVar(&o.auth, "auth", false, "secure the embedded NATS server: nkey users for the node, client and operator permission profiles, seeds generated into --auth-dir; meshd connects as node (SECURITY.md)")
	f.Var(checked(&o.authDir, optional(checkDir)), "auth-dir", "where --auth keeps the seeds node.nk, client.nk, operator.nk (mode 0600); empty means <data-dir>/auth")
	f.BoolVar(&o.insecureListen, "insecure-listen", false, "let the embedded NATS server listen beyond loopback without --auth")
	f.Var(checked(&o.creds, optional(natsauth.CheckCreds)), "creds", "NATS credentials file")
	f.Var(checked(&o.nkey, optional(natsauth.CheckNKey)), "nkey", "NATS nkey seed file")
	f.StringVar(&o.user, "user", "", "NATS user")
	f.StringVar(&o.password, "password", "", "NATS password")
	f.Var(checked(&o.tlsCert, optional(natsauth.CheckReadable)), "tls-cert", "TLS client certificate file")
	f.Var(checked(&o.tlsKey, optional(natsauth.CheckReadable)), "tls-key", "TLS client key file")
	f.Var(checked(&o.tlsCA, optional(natsauth.CheckCA)), "tls-ca", "TLS CA file to verify the NATS servers")
	o.http = "127.0.0.1:7070"
	f.Var(checked(&o.http, optional(checkAddr)), "http", "address of /metrics, /healthz, /readyz; empty disables")
	f.Var(nonNegativeDuration(&o.drainTimeout, daemon.DefaultDrainTimeout), "drain-timeout", "bound on the drain at shutdown")
	f.BoolVar(&o.standalone, "standalone", false, "a one-node mesh without the membership registry and directory (no JetStream needed)")
	f.Var(nonNegativeInt(&o.kvReplicas, 1), "kv-replicas", "replicas of the registry and directory KV buckets, used by the node that creates them; 3 on a 3-server cluster")
	f.Var(checked(&o.kvCluster, optional(clusterName)), "kv-cluster", "place the buckets and streams this node creates in the NATS cluster of this name (a supercluster's home cluster, docs/DESIGN.md \"Beyond one cluster\"); empty: the creating node's cluster")
	f.Var(nonNegativeInt(&o.stateReplicas, 0), "state-replicas", "replicas of the durable hub state bucket (file storage), used by the node that creates it; 0 means --kv-replicas; 3 on a 3-server cluster")
	f.Var(nonNegativeInt(&o.stateMaxValue, 0), "state-max-value", "largest durable state one address may save, in bytes; 0 means 1 MiB - 4 KiB (lowered to fit the server's max_payload)")
	f.Var(nonNegativeDuration(&o.heartbeat, defaultHeartbeat), "heartbeat", "registry heartbeat; 0 means the default")
	f.Var(nonNegativeDuration(&o.ttl, defaultTTL), "ttl", "a node silent this long is declared gone; set by the node that creates the registry, later nodes follow it; 0 means the default")
	f.Var(nonNegativeDuration(&o.idle, hub.DefaultIdleTimeout), "idle-timeout", "collect an activation that had no work for this long (its claim released, its next delivery activates it again, on whichever node placement picks); 0 means the default")
	f.Var(nonNegativeDuration(&o.placementWait, mesh.DefaultPlacementWait), "placement-wait", "how long a delivery to a kind no live node hosts is retried before it fails Unavailable (no-placement); 0 means the default")
	// request-info is right in both modes: only a request that crossed a
	// service import has a _R_ reply (the server refuses one a client
	// names), so its Nats-Request-Info is the server's; any other request
	// falls back to its inbox prefix, as with inbox.
	o.callerIdentity = "request-info"
	f.Var(checked(&o.callerIdentity, oneOf("inbox", "request-info")), "caller-identity", "where the ingress takes a caller's identity from, which scopes delivery IDs (SECURITY.md): request-info (the account and user the server stamps in Nats-Request-Info on a request that crossed the ingress's service import — tenants in their own accounts — else the reply's inbox prefix, as inbox; right in both modes) or inbox (the reply's inbox prefix only)")
	f.Var(checked(&o.callerRate, optional(checkRate)), "ingress-caller-rate", "limit each ingress caller to this many deliveries per second (a decimal > 0; over it Ignored storm-breaker, SECURITY.md); empty means no limit")
	f.Var(nonNegativeInt(&o.callerBurst, 0), "ingress-caller-burst", "the burst of --ingress-caller-rate, in deliveries; 0 means the rate")
	f.Var(checked(&o.clientInboxes, optional(checkInboxes)), "client-inboxes", "comma-separated inbox prefixes of the account's client users (e.g. _INBOX.alice,_INBOX.bob): with one account, the ingress refuses a reply under one of them that is not that user's own shape (SECURITY.md)")
	f.BoolVar(&o.replace, "replace", false, "take the name over from a live node of the same name (it stands down and exits); without it meshd exits at once if its name is live")
	o.logFormat, o.logLevel = "auto", "info"
	f.Var(checked(&o.logFormat, oneOf("auto", "text", "json")), "log-format", "auto (text on a terminal, else JSON), text or json")
	f.Var(checked(&o.logLevel, func(v string) error {
		var lv slog.Level
		if lv.UnmarshalText([]byte(v)) != nil {
			return errors.New("want debug, info, warn or error")
		}
		return nil
	}), "log-level", "debug, info, warn or error")
	env := envflag.New(f)
	o.env = env
	f.VisitAll(func(fl *pflag.Flag) {
		env.Bind(fl.Name, "MESHD_"+strings.ToUpper(strings.ReplaceAll(fl.Name, "-", "_")))
	})
	cmd.PreRunE = func(*cobra.Command, []string) error {
		if err := env.Apply(nil); err != nil {
			return usageError{err}
		}
		if err := o.checkSettings(); err != nil {
			return usageError{err}
		}
		o.dataDirSet = f.Changed("data-dir")
		return nil
	}
	cmd.AddCommand(newDrainCmd(stdout))
	cmd.CompletionOptions.DisableDefaultCmd = true
	cmd.SetVersionTemplate("meshd {{.Version}}\n")
	cmd.SetOut(stdout)
	cmd.SetErr(stderr)
	cmd.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return usageError{err}
	})
	return cmd
}

type usageError struct{ error }

// checkedString is a string flag whose value check accepts: a bad value is
// refused when it is set, so the error names where it came from (the flag,
// or its MESHD_ variable through envflag).
type checkedString struct {
	p     *string
	check func(string) error
}

func checked(p *string, check func(string) error) *checkedString {
	return &checkedString{p: p, check: check}
}

func (c *checkedString) String() string {
	if c.p == nil {
		return ""
	}
	return *c.p
}

func (c *checkedString) Set(v string) error {
	if err := c.check(v); err != nil {
		return err
	}
	*c.p = v
	return nil
}

func (c *checkedString) Type() string { return "string" }

// oneOf checks that a value is one of want.
// checkRate accepts a decimal deliveries-per-second rate above zero.
func checkRate(v string) error {
	r, err := strconv.ParseFloat(v, 64)
	if err != nil || r <= 0 || math.IsInf(r, 0) || math.IsNaN(r) {
		return errors.New("want a decimal rate above 0, in deliveries per second")
	}
	return nil
}

// parseRate is checkRate's value, 0 for none.
func parseRate(v string) float64 {
	r, _ := strconv.ParseFloat(v, 64)
	return r
}

// checkInboxes accepts comma-separated inbox prefixes: dot-separated
// tokens of [A-Za-z0-9_-].
func checkInboxes(v string) error {
	for _, in := range splitList(v) {
		if err := subjects.Prefix(in).Validate(); err != nil {
			return fmt.Errorf("inbox prefix %q: want dot-separated tokens of [A-Za-z0-9_-]", in)
		}
	}
	return nil
}

// splitList splits a comma-separated list, dropping empty items.
func splitList(v string) []string {
	var out []string
	for p := range strings.SplitSeq(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// callerIdentities maps --caller-identity to the node's mode.
var callerIdentities = map[string]mesh.CallerIdentity{"inbox": mesh.CallerFromInbox, "request-info": mesh.CallerFromRequestInfo}

func oneOf(want ...string) func(string) error {
	return func(v string) error {
		if slices.Contains(want, v) {
			return nil
		}
		return fmt.Errorf("want %s", strings.Join(want, ", "))
	}
}

func serve(ctx context.Context, o options, stdout, stderr io.Writer, ready func(daemon.Info)) error {
	logger, err := newLogger(o.logFormat, o.logLevel, stderr)
	if err != nil {
		return usageError{err}
	}
	if err := o.preflight(); err != nil {
		return err
	}
	kinds := []string{} // empty: a node that hosts no kind (it still sends and serves the ingress)
	for k := range strings.SplitSeq(o.hubs, ",") {
		if k = strings.TrimSpace(k); k != "" {
			kinds = append(kinds, k)
		}
	}
	dataDir := o.dataDir
	if o.natsURL != "" && !o.dataDirSet {
		dataDir = "" // on an external cluster: no directory unless one is given
	}
	cfg := daemon.Config{
		Name: o.name, Prefix: subjects.Prefix(o.prefix), Hubs: kinds, TracingFromEnv: true,
		NATSURL: o.natsURL, Listen: o.listen, DataDir: dataDir, LeafRemote: o.leafRemote, LeafCreds: o.leafCreds,
		Auth: o.auth, AuthDir: o.authDir, InsecureListen: o.insecureListen,
		CredsFile: o.creds, NKeyFile: o.nkey, User: o.user, Password: o.password,
		TLSCert: o.tlsCert, TLSKey: o.tlsKey, TLSCA: o.tlsCA,
		HTTP: o.http, DrainTimeout: o.drainTimeout, Logger: logger,
		Standalone: o.standalone, KVReplicas: o.kvReplicas, KVCluster: o.kvCluster, Heartbeat: o.heartbeat, TTL: o.ttl,
		StateReplicas: o.stateReplicas, StateMaxValueSize: o.stateMaxValue,
		PlacementWait:     o.placementWait,
		IdleTimeout:       o.idle,
		CallerIdentity:    callerIdentities[o.callerIdentity],
		IngressCallerRate: parseRate(o.callerRate), IngressCallerBurst: o.callerBurst,
		ClientInboxes: splitList(o.clientInboxes),
		Replace:       o.replace,
		Ready: func(info daemon.Info) {
			if info.Embedded {
				fmt.Fprintf(stdout, "meshd: node %s serving on embedded NATS at %s\n", info.Node, info.NATSURL)
			} else {
				fmt.Fprintf(stdout, "meshd: node %s serving on NATS at %s\n", info.Node, info.NATSURL)
			}
			if ready != nil {
				ready(info)
			}
		},
	}
	err = daemon.Run(ctx, cfg)
	if errors.Is(err, daemon.ErrInvalidConfig) {
		return usageError{err}
	}
	if natsauth.LoginRefused(err) {
		return fmt.Errorf("%w: the server refused the login: %s", err, o.loginHint())
	}
	if errors.Is(err, nats.ErrNoServers) && o.natsURL != "" {
		return fmt.Errorf("%w (the URL of %s)", err, o.env.Origin("nats-url"))
	}
	return err
}

func newLogger(format, level string, w io.Writer) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "auto":
		if f, ok := w.(*os.File); ok && isatty.IsTerminal(f.Fd()) {
			return slog.New(slog.NewTextHandler(w, opts)), nil
		}
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want auto, text or json", format)
}

// run executes meshd with args and returns the exit code: 0 after a clean
// drain, 1 for bad usage or configuration, 2 when the node could not start
// or its drain was cut short. signals, if nil, are SIGTERM and SIGINT.
func run(args []string, stdout, stderr io.Writer, sig <-chan os.Signal) int {
	return runWith(args, stdout, stderr, sig, nil)
}

func runWith(args []string, stdout, stderr io.Writer, sig <-chan os.Signal, ready func(daemon.Info)) int {
	if sig == nil {
		ch := make(chan os.Signal, 2)
		signal.Notify(ch, syscall.SIGTERM, syscall.SIGINT)
		defer signal.Stop(ch)
		sig = ch
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		s, ok := <-sig
		if !ok {
			return
		}
		fmt.Fprintf(stderr, "meshd: %v: draining (send again to exit at once)\n", s)
		cancel()
		if _, ok := <-sig; ok {
			fmt.Fprintln(stderr, "meshd: second signal: exiting now")
			os.Exit(130)
		}
	}()
	cmd := newRootCmd(stdout, stderr, ready)
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	var ue usageError
	if errors.As(err, &ue) || strings.HasPrefix(err.Error(), "unknown command") {
		fmt.Fprintf(stderr, "meshd: %s (see meshd --help)\n", oneLine(err))
		return 1
	}
	fmt.Fprintf(stderr, "meshd: %s\n", oneLine(err))
	return 2
}

func oneLine(err error) string {
	return strings.ReplaceAll(strings.TrimSpace(err.Error()), "\n", "; ")
}
