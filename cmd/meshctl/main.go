// Command meshctl is the operator CLI of natsmesh: it lists the nodes of a
// mesh, their hubs and counters, sends deliveries and requests through the
// ingress, follows a hub's sync stream, drains a node and benchmarks
// delivery throughput. It talks to the mesh over NATS only (the nodes' micro
// service and control endpoints, and the ingress subjects), so it needs
// nothing but a NATS URL (and the account's credentials: the same options as
// meshd, or a nats CLI context); subscribe registers as a subscriber in the
// mesh's membership for its duration, which needs JetStream on the account.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/natsmesh/natsmesh/internal/buildinfo"
	"github.com/natsmesh/natsmesh/internal/envflag"
	"github.com/natsmesh/natsmesh/internal/natsauth"
	"github.com/natsmesh/natsmesh/internal/natsurl"
	"github.com/natsmesh/natsmesh/subjects"
)

// Exit codes (documented in the root command's Long help).
const (
	exitOK          = 0   // success
	exitUsage       = 1   // bad usage or invalid input
	exitNoNATS      = 2   // cannot reach NATS
	exitVerdict     = 3   // the mesh answered a failure verdict, or no node answered
	exitTimeout     = 4   // no answer in time
	exitInterrupted = 130 // interrupted (Ctrl-C)
)

const rootLong = `meshctl operates a natsmesh message mesh over NATS: it lists the nodes and
their hubs and counters, sends deliveries and requests through the ingress,
follows a hub's sync stream (subscribe), reads a hub's stored state (state
get), drains a node and benchmarks delivery throughput.

Connecting: each setting is taken from its flag, else its environment
variable (as the nats CLI names them), else the nats CLI context (--context
NAME, NATS_CONTEXT, else the context selected with "nats context select"),
else the default:
  --server    NATS_URL        nats://127.0.0.1:4222
  --creds     NATS_CREDS      credentials file (JWT and seed)
  --nkey      NATS_NKEY       nkey seed file
  --user      NATS_USER       with --password (NATS_PASSWORD)
  --tls-cert  NATS_CERT       TLS client certificate, with --tls-key (NATS_KEY)
  --tls-ca    NATS_CA         CA to verify the servers
  --context   NATS_CONTEXT    ~/.config/nats/context/NAME.json ($XDG_CONFIG_HOME)
--prefix, --output and --timeout read MESHCTL_PREFIX, MESHCTL_OUTPUT and
MESHCTL_TIMEOUT. An invalid value is an error naming its variable.

Exit codes:
  0    success
  1    bad usage or invalid input (unknown flag or command, bad address,
       malformed NATS URL, payload over the server's max_payload, ...)
  2    cannot reach NATS (connection refused, ...) or the login refused
       (the line names the credential options and the profile needed),
       the server refused an operation as a permissions violation (the
       NATS user's profile does not allow it: SECURITY.md), or no
       JetStream on the account (subscribe needs the membership)
  3    the mesh answered a failure verdict (its name, reason and message
       are printed; Unavailable (no-placement): no node hosts the kind,
       nothing was placed), or no node answered at all (nodes, hubs and
       stats with no node; no responders); for subscribe also: the
       subscription was torn down
  4    timeout: no answer in --timeout. The outcome of a delivery is then
       unknown (the mesh may hold it and still run it): do not re-send it
       blindly; a re-send under the same --id may be deduped
  130  interrupted (Ctrl-C)

Errors are printed as one line on stderr, prefixed "meshctl: ".`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := runIO(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run executes meshctl with args (without the program name) and returns the
// exit code; standard input is os.Stdin.
func run(args []string, stdout, stderr io.Writer) int {
	return runIO(context.Background(), args, os.Stdin, stdout, stderr)
}

// runIO is run with an explicit context and standard input.
func runIO(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	root := newRootCmd(stdout, stderr)
	root.SetIn(stdin)
	root.SetArgs(args)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return exitOK
	}
	if cmd != nil && errors.Is(err, context.Canceled) && ctx.Err() == nil {
		// Not interrupted: the command's context was ended with a cause
		// (a permissions violation).
		if cause := context.Cause(cmd.Context()); cause != nil && !errors.Is(cause, context.Canceled) {
			err = cause
		}
	}
	var ee *exitError
	if errors.As(err, &ee) {
		fmt.Fprintln(stderr, "meshctl: "+oneLine(ee.Error()))
		return ee.code
	}
	if errors.Is(err, context.Canceled) {
		fmt.Fprintln(stderr, "meshctl: interrupted")
		return exitInterrupted
	}
	// Anything else comes from cobra itself: an unknown flag or command,
	// or a wrong number of arguments.
	path := "meshctl"
	if cmd != nil {
		path = cmd.CommandPath()
	}
	fmt.Fprintf(stderr, "meshctl: %s (see %s --help)\n", oneLine(err.Error()), path)
	return exitUsage
}

// exitError is an error with the exit code it maps to.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func exitf(code int, format string, args ...any) error {
	return &exitError{code: code, err: fmt.Errorf(format, args...)}
}

func usageErrorf(format string, args ...any) error { return exitf(exitUsage, format, args...) }

// oneLine keeps an error message on one line.
func oneLine(s string) string {
	s = strings.TrimSpace(s)
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", " ")), " ")
}

// globals are the persistent flags, shared by every command.
type globals struct {
	server   string
	output   string
	prefix   string
	timeout  time.Duration
	context  string
	creds    string
	nkey     string
	user     string
	password string
	tlsCert  string
	tlsKey   string
	tlsCA    string
	// From the nats context (no flags): a token, an inbox prefix, TLS
	// first.
	token       string
	inboxPrefix string
	tlsFirst    bool

	otherPrefixes []string        // found by discover: nodes of other meshes
	contextName   string          // the nats context in use, if any
	contextPath   string          // its file
	fromContext   map[string]bool // the flags whose value came from the context

	env            *envflag.Set
	stdout, stderr io.Writer
	// deny ends the running command's context with the cause given: set
	// before the command runs, called by a connection's error handler on a
	// permissions violation (conn.go).
	deny context.CancelCauseFunc
	// command is the running command's path below the root ("state
	// get"), for error messages.
	command string
}

func (g *globals) json() bool { return g.output == "json" }

func (g *globals) meshPrefix() subjects.Prefix { return subjects.Prefix(g.prefix) }

// defaultServer is the NATS URL without flag, environment or context.
const defaultServer = "nats://127.0.0.1:4222"

// resolve fills the connection settings from the environment and the nats
// context: a flag given wins, then its environment variable, then the
// context (--context, NATS_CONTEXT, else the nats CLI's selected context),
// then the default.
func (g *globals) resolve(fs *pflag.FlagSet) error {
	if err := g.env.Apply(nil); err != nil {
		return usageErrorf("%v", err)
	}
	name := g.context
	if v, set := os.LookupEnv("NATS_CONTEXT"); name == "" && (fs.Changed("context") || (set && v == "")) {
		return nil // --context '' or NATS_CONTEXT='': no context, not even the selected one
	}
	if name == "" {
		sel, err := selectedContext()
		if err != nil {
			return usageErrorf("%v", err)
		}
		name = sel
	}
	if name == "" {
		return nil
	}
	c, err := loadContext(name)
	if err != nil {
		from := g.origin("context")
		if g.context == "" {
			from = "the nats context selected with `nats context select`"
		}
		return usageErrorf("%s: %v", from, err)
	}
	g.fromContext = map[string]bool{}
	set := func(flag string, dst *string, v string) {
		if v != "" && !fs.Changed(flag) {
			*dst = v
			g.fromContext[flag] = true
		}
	}
	set("server", &g.server, c.URL)
	g.contextName, g.contextPath = c.Name, c.Path
	// The context's credentials only if no credentials were given.
	if !fs.Changed("creds") && !fs.Changed("nkey") && !fs.Changed("user") {
		if c.NSC != "" && c.Creds == "" {
			return usageErrorf("nats context %q: its nsc:// lookup is not supported; give --creds or set creds in the context", c.Name)
		}
		set("creds", &g.creds, c.Creds)
		set("nkey", &g.nkey, c.NKey)
		set("user", &g.user, c.User)
		set("password", &g.password, c.Password)
		g.token = c.Token
	}
	if !fs.Changed("tls-cert") && !fs.Changed("tls-key") {
		set("tls-cert", &g.tlsCert, c.Cert)
		set("tls-key", &g.tlsKey, c.Key)
	}
	set("tls-ca", &g.tlsCA, c.CA)
	g.inboxPrefix, g.tlsFirst = c.InboxPrefix, c.TLSFirst
	return nil
}

// contextKeys are the nats context's field names of the flags it can set.
var contextKeys = map[string]string{
	"server": "url", "creds": "creds", "nkey": "nkey", "user": "user", "password": "password",
	"tls-cert": "cert", "tls-key": "key", "tls-ca": "ca",
}

// origin names where a global flag's value came from, for an error about
// it: its environment variable, the nats context, or the flag.
func (g *globals) origin(flag string) string {
	if k := g.env.Source(flag); k != "" {
		return k
	}
	if g.fromContext[flag] {
		return fmt.Sprintf("%s of nats context %q", contextKeys[flag], g.contextName)
	}
	return "--" + flag
}

// setting is origin with the value: NATS_URL="…", --server="…", or
// url "…" of nats context "prod" (…/prod.json).
func (g *globals) setting(flag string, value any) string {
	if g.env.Source(flag) == "" && g.fromContext[flag] {
		return fmt.Sprintf("%s %q of nats context %q (%s)", contextKeys[flag], fmt.Sprint(value), g.contextName, g.contextPath)
	}
	if k := g.env.Source(flag); k != "" {
		return fmt.Sprintf("%s=%q (for --%s)", k, fmt.Sprint(value), flag)
	}
	return fmt.Sprintf("%s=%q", g.origin(flag), fmt.Sprint(value))
}

// validate checks the global flags before any command runs; an error names
// the flag, environment variable or nats context the bad value came from.
func (g *globals) validate() error {
	switch g.output {
	case "table", "json":
	default:
		return usageErrorf("invalid %s (want table or json)", g.setting("output", g.output))
	}
	if _, err := subjects.ParsePrefix(g.prefix); err != nil {
		return usageErrorf("invalid %s: %v", g.setting("prefix", g.prefix), err)
	}
	if g.timeout <= 0 {
		return usageErrorf("invalid %s (want > 0)", g.setting("timeout", g.timeout))
	}
	if err := natsurl.Validate(g.server); err != nil {
		return usageErrorf("invalid %s: %v", g.setting("server", g.server), err)
	}
	if g.password != "" && g.user == "" {
		return usageErrorf("%s needs --user (NATS_USER)", g.origin("password"))
	}
	var given []string
	for _, f := range []struct{ flag, v string }{{"creds", g.creds}, {"nkey", g.nkey}, {"user", g.user}} {
		if f.v != "" {
			given = append(given, g.origin(f.flag))
		}
	}
	if len(given) > 1 {
		return usageErrorf("give one of --creds, --nkey and --user, not both %s", strings.Join(given, " and "))
	}
	if (g.tlsCert == "") != (g.tlsKey == "") {
		flag := "tls-cert"
		if g.tlsCert == "" {
			flag = "tls-key"
		}
		return usageErrorf("a TLS client certificate needs both --tls-cert and --tls-key; only %s is given", g.origin(flag))
	}
	// The files are read as nats.go will read them, so that a bad one is
	// bad input naming its setting, not a failed connection.
	for _, f := range []struct {
		flag, path string
		check      func(string) error
	}{
		{"creds", g.creds, natsauth.CheckCreds}, {"nkey", g.nkey, natsauth.CheckNKey},
		{"tls-cert", g.tlsCert, natsauth.CheckReadable}, {"tls-key", g.tlsKey, natsauth.CheckReadable},
		{"tls-ca", g.tlsCA, natsauth.CheckCA},
	} {
		if f.path == "" {
			continue
		}
		if err := f.check(f.path); err != nil {
			return usageErrorf("invalid %s: %v", g.setting(f.flag, f.path), err)
		}
	}
	if g.tlsCert != "" {
		if err := natsauth.CheckClientCert(g.tlsCert, g.tlsKey); err != nil {
			return usageErrorf("invalid %s and %s: %v", g.setting("tls-cert", g.tlsCert), g.setting("tls-key", g.tlsKey), err)
		}
	}
	return nil
}

// newRootCmd builds the meshctl command tree writing to stdout and stderr.
func newRootCmd(stdout, stderr io.Writer) *cobra.Command {
	g := &globals{stdout: stdout, stderr: stderr}
	root := &cobra.Command{
		Use:           "meshctl",
		Short:         "Operate a natsmesh message mesh",
		Long:          rootLong,
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       buildinfo.Read().String(),
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			if err := g.resolve(cmd.Flags()); err != nil {
				return err
			}
			// A permissions violation reported by the server ends the
			// command at once, naming it (conn.go), instead of leaving
			// it to wait out --timeout for an answer that cannot come.
			ctx, deny := context.WithCancelCause(cmd.Context())
			cmd.SetContext(ctx)
			g.deny = deny
			g.command = strings.TrimPrefix(cmd.CommandPath(), cmd.Root().Name()+" ")
			return g.validate()
		},
	}
	root.SetVersionTemplate("meshctl {{.Version}}\n")
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return err })

	pf := root.PersistentFlags()
	pf.StringVarP(&g.server, "server", "s", defaultServer, "NATS server URL(s), comma separated")
	pf.StringVarP(&g.output, "output", "o", "table", "output format: table or json")
	pf.StringVar(&g.prefix, "prefix", string(subjects.DefaultPrefix), "subject prefix of the mesh")
	pf.DurationVar(&g.timeout, "timeout", 15*time.Second, "how long to wait for an answer (covers the mesh's ≈10 s retry ladder)")
	pf.StringVar(&g.context, "context", "", "nats CLI context to connect with (~/.config/nats/context/NAME.json); default: the selected one, if any; '' for none")
	pf.StringVar(&g.creds, "creds", "", "NATS user credentials file")
	pf.StringVar(&g.nkey, "nkey", "", "NATS nkey seed file")
	pf.StringVar(&g.user, "user", "", "NATS user name")
	pf.StringVar(&g.password, "password", "", "NATS password")
	pf.StringVar(&g.tlsCert, "tls-cert", "", "TLS client certificate file")
	pf.StringVar(&g.tlsKey, "tls-key", "", "TLS client key file")
	pf.StringVar(&g.tlsCA, "tls-ca", "", "TLS CA file to verify the NATS servers")
	g.env = envflag.New(pf)
	for flag, keys := range map[string][]string{
		"server": {"NATS_URL"}, "context": {"NATS_CONTEXT"}, "creds": {"NATS_CREDS"}, "nkey": {"NATS_NKEY"},
		"user": {"NATS_USER"}, "password": {"NATS_PASSWORD"}, "tls-cert": {"NATS_CERT"}, "tls-key": {"NATS_KEY"}, "tls-ca": {"NATS_CA"},
		"output": {"MESHCTL_OUTPUT"}, "prefix": {"MESHCTL_PREFIX"}, "timeout": {"MESHCTL_TIMEOUT"},
	} {
		g.env.Bind(flag, keys...)
	}

	root.AddCommand(
		newNodesCmd(g),
		newHubsCmd(g),
		newStatsCmd(g),
		newSendCmd(g, false),
		newSendCmd(g, true),
		newSubscribeCmd(g),
		newDrainCmd(g),
		newBenchCmd(g),
		newStateCmd(g),
		newRemindersCmd(g),
	)
	return root
}
