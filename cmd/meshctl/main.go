// Command meshctl is the operator CLI of natsmesh: it lists the nodes of a
// mesh, their hubs and counters, sends deliveries and requests through the
// ingress, follows a hub's sync stream, drains a node and benchmarks
// delivery throughput. It talks to the mesh over NATS only (the nodes' micro
// service and control endpoints, and the ingress subjects), so it needs
// nothing but a NATS URL; subscribe joins the mesh's membership for its
// duration, which needs JetStream on the account.
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
follows a hub's sync stream (subscribe), drains a node and benchmarks
delivery throughput.

The NATS server is taken from --server, else from the NATS_URL environment
variable, else nats://127.0.0.1:4222.

Exit codes:
  0    success
  1    bad usage or invalid input (unknown flag or command, bad address,
       payload over the server's max_payload, ...)
  2    cannot reach NATS (connection refused, authorization failed, ...),
       or no JetStream on the account (subscribe needs the membership)
  3    the mesh answered a failure verdict (its name, reason and message
       are printed), or no node answered at all (no responders); for
       subscribe also: the subscription was torn down
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
	creds    string
	user     string
	password string

	stdout, stderr io.Writer
}

func (g *globals) json() bool { return g.output == "json" }

func (g *globals) meshPrefix() subjects.Prefix { return subjects.Prefix(g.prefix) }

// validate checks the global flags before any command runs.
func (g *globals) validate() error {
	switch g.output {
	case "table", "json":
	default:
		return usageErrorf("invalid --output %q (want table or json)", g.output)
	}
	if _, err := subjects.ParsePrefix(g.prefix); err != nil {
		return usageErrorf("invalid --prefix: %v", err)
	}
	if g.timeout <= 0 {
		return usageErrorf("invalid --timeout %v (want > 0)", g.timeout)
	}
	if g.server == "" {
		return usageErrorf("empty --server")
	}
	if g.password != "" && g.user == "" {
		return usageErrorf("--password needs --user")
	}
	if g.creds != "" {
		if _, err := os.Stat(g.creds); err != nil {
			return usageErrorf("--creds: %v", err)
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
		PersistentPreRunE: func(*cobra.Command, []string) error {
			return g.validate()
		},
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return err })

	defServer := os.Getenv("NATS_URL")
	if defServer == "" {
		defServer = "nats://127.0.0.1:4222"
	}
	pf := root.PersistentFlags()
	pf.StringVarP(&g.server, "server", "s", defServer, "NATS server URL(s), comma separated; the default is NATS_URL if set")
	pf.StringVarP(&g.output, "output", "o", "table", "output format: table or json")
	pf.StringVar(&g.prefix, "prefix", string(subjects.DefaultPrefix), "subject prefix of the mesh")
	pf.DurationVar(&g.timeout, "timeout", 15*time.Second, "how long to wait for an answer (covers the mesh's ≈10 s retry ladder)")
	pf.StringVar(&g.creds, "creds", "", "NATS user credentials file")
	pf.StringVar(&g.user, "user", "", "NATS user name")
	pf.StringVar(&g.password, "password", "", "NATS password")

	root.AddCommand(
		newNodesCmd(g),
		newHubsCmd(g),
		newStatsCmd(g),
		newSendCmd(g, false),
		newSendCmd(g, true),
		newSubscribeCmd(g),
		newDrainCmd(g),
		newBenchCmd(g),
	)
	return root
}
