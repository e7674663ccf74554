package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/natsmesh/natsmesh/internal/natsauth"
	"github.com/natsmesh/natsmesh/mesh"
	"github.com/natsmesh/natsmesh/subjects"
)

// connectTimeout bounds dialing NATS, whatever --timeout says.
const connectTimeout = 5 * time.Second

// connect opens a NATS connection with the global flags, named name. A CLI
// command is short: a lost connection is an error, not something to wait
// out. Its errors map to exit code 2.
func (g *globals) connect(name string) (*nats.Conn, error) {
	return g.dial(name, nats.NoReconnect())
}

// profileFor names the permission profile (package profiles, SECURITY.md)
// a meshctl command needs: subscribe and bench act as mesh clients (they
// publish deliveries to nodes and read answers), so they need the node
// profile; everything else works with the operator profile.
func profileFor(command string) string {
	switch command {
	case "subscribe", "bench":
		return "node"
	}
	return "operator"
}

// reconnectWait is how long a reconnecting connection (connectReconnecting)
// waits between attempts.
const reconnectWait = 250 * time.Millisecond

// connectReconnecting is connect for a long-running command (bench) that
// must ride out a NATS server restart: it reconnects without limit, and on
// a lame duck notice of its server it calls lameDuck (which should move the
// connection: mesh.Client.MoveConnection).
func (g *globals) connectReconnecting(name string, lameDuck func()) (*nats.Conn, error) {
	return g.dial(name, nats.MaxReconnects(-1), nats.ReconnectWait(reconnectWait),
		nats.LameDuckModeHandler(func(*nats.Conn) { lameDuck() }))
}

func (g *globals) dial(name string, extra ...nats.Option) (*nats.Conn, error) {
	opts := []nats.Option{
		nats.Name(name),
		nats.Timeout(connectTimeout),
		nats.NoCallbacksAfterClientClose(),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			if errors.Is(err, nats.ErrPermissionViolation) && g.deny != nil {
				g.deny(exitf(exitNoNATS, "%v: this NATS user may not do that: meshctl %s needs the %s profile (SECURITY.md)", err, g.command, profileFor(g.command)))
			}
		}),
	}
	switch {
	case g.creds != "":
		opts = append(opts, nats.UserCredentials(g.creds))
	case g.nkey != "":
		o, err := nats.NkeyOptionFromSeed(g.nkey)
		if err != nil {
			return nil, usageErrorf("--nkey: %v", err)
		}
		opts = append(opts, o)
	case g.user != "":
		opts = append(opts, nats.UserInfo(g.user, g.password))
	case g.token != "":
		opts = append(opts, nats.Token(g.token))
	}
	if g.tlsCert != "" {
		opts = append(opts, nats.ClientCert(g.tlsCert, g.tlsKey))
	}
	if g.tlsCA != "" {
		opts = append(opts, nats.RootCAs(g.tlsCA))
	}
	if g.tlsFirst {
		opts = append(opts, nats.TLSHandshakeFirst())
	}
	if g.inboxPrefix != "" {
		opts = append(opts, nats.CustomInboxPrefix(g.inboxPrefix))
	}
	opts = append(opts, extra...)
	nc, err := nats.Connect(g.server, opts...)
	if err != nil {
		from := ""
		switch {
		case g.env.Source("server") != "":
			from = " (" + g.env.Source("server") + ")"
		case g.contextName != "":
			from = fmt.Sprintf(" (with nats context %q)", g.contextName)
		}
		if natsauth.LoginRefused(err) {
			return nil, exitf(exitNoNATS, "NATS at %s%s refused the login (%v): %s", g.server, from, err, g.loginHint())
		}
		return nil, exitf(exitNoNATS, "cannot connect to NATS at %s%s: %v", g.server, from, err)
	}
	return nc, nil
}

// credentialOptions names meshctl's ways to log in, for a hint.
const credentialOptions = "--creds FILE, --user NAME with --password, --nkey FILE (NATS_CREDS, NATS_USER/NATS_PASSWORD, NATS_NKEY) or a nats context (--context NAME)"

// loginHint says what to do about a refused login: which credentials were
// used and where they came from, or that none were given, and the options
// that give them with the permission profile meshctl needs.
func (g *globals) loginHint() string {
	var used string
	switch {
	case g.creds != "":
		used = "the credentials file of " + g.origin("creds")
	case g.nkey != "":
		used = "the nkey seed of " + g.origin("nkey")
	case g.user != "":
		used = "the user and password of " + g.origin("user")
	case g.token != "":
		used = fmt.Sprintf("the token of nats context %q", g.contextName)
	}
	profile := "a user with the operator profile (the client profile suffices for send and request; subscribe needs the node profile; SECURITY.md)"
	if used == "" {
		return "no credentials were given; log in with " + credentialOptions + " as " + profile
	}
	return "it does not accept " + used + "; check them, or log in with " + credentialOptions + " as " + profile
}

// natsError maps an error of a NATS operation to its exit code: a timeout
// is 4, a lost connection 2, an oversized message 1, anything else 2.
func natsError(err error, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	switch {
	case errors.Is(err, context.Canceled):
		return err
	case errors.Is(err, nats.ErrTimeout), errors.Is(err, context.DeadlineExceeded):
		return exitf(exitTimeout, "%s: no answer in time", msg)
	case errors.Is(err, nats.ErrMaxPayload):
		return exitf(exitUsage, "%s: message over the server's max_payload", msg)
	default:
		return exitf(exitNoNATS, "%s: %v", msg, err)
	}
}

// isNoResponders reports whether m is the server's "no responders" status
// message (503), sent to a request's reply subject when nothing subscribes to
// the request subject.
func isNoResponders(m *nats.Msg) bool {
	return len(m.Data) == 0 && m.Header.Get("Status") == "503"
}

// idleWindow is how long gather waits for one more reply after the last.
const idleWindow = 300 * time.Millisecond

// gather publishes a request on subject and collects the replies: until want
// replies came (want > 0), until idleWindow passed since the last reply, or
// until timeout; the first reply is awaited for the whole timeout. A "no
// responders" status ends it at once with no replies and noResponders set.
// No reply at all by the timeout returns no replies and no error: the caller
// decides what silence means.
func gather(ctx context.Context, nc *nats.Conn, subject string, data []byte, want int, timeout time.Duration) (msgs []*nats.Msg, noResponders bool, err error) {
	inbox := nc.NewRespInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return nil, false, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	_ = sub.SetPendingLimits(-1, -1)
	if err := nc.PublishRequest(subject, inbox, data); err != nil {
		return nil, false, err
	}
	deadline := time.Now().Add(timeout)
	var out []*nats.Msg
	for want <= 0 || len(out) < want {
		end := deadline
		if len(out) > 0 {
			if idle := time.Now().Add(idleWindow); idle.Before(deadline) {
				end = idle
			}
		}
		wctx, cancel := context.WithDeadline(ctx, end)
		m, err := sub.NextMsgWithContext(wctx)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return out, false, ctx.Err()
			}
			if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) {
				return out, false, nil
			}
			if errors.Is(err, nats.ErrNoResponders) {
				// nats.go turns the 503 status into this error.
				return out, len(out) == 0, nil
			}
			if len(out) > 0 && (errors.Is(err, nats.ErrConnectionClosed) || errors.Is(err, nats.ErrBadSubscription)) {
				// The answers arrived; the server went away after (a
				// drained meshd on its embedded server stops it).
				return out, false, nil
			}
			return out, false, err
		}
		if isNoResponders(m) {
			return out, len(out) == 0, nil
		}
		out = append(out, m)
	}
	return out, false, nil
}

// discovered is one node generation found through the micro service.
type discovered struct {
	Name string // node name
	Node string // "name.gen"
}

// discover asks every natsmesh micro service for its info and returns the
// nodes of prefix, sorted by name and generation.
func (g *globals) discover(ctx context.Context, nc *nats.Conn) ([]discovered, error) {
	subject, err := micro.ControlSubject(micro.InfoVerb, mesh.ServiceName, "")
	if err != nil {
		return nil, err
	}
	msgs, _, err := gather(ctx, nc, subject, nil, 0, g.timeout)
	if err != nil {
		return nil, natsError(err, "discover nodes on %s", subject)
	}
	seen := map[string]bool{}
	var out []discovered
	for _, m := range msgs {
		var info micro.Info
		if json.Unmarshal(m.Data, &info) != nil || info.Name != mesh.ServiceName {
			continue
		}
		if p := info.Metadata[mesh.MetaPrefix]; p != g.prefix {
			g.otherPrefixes = append(g.otherPrefixes, p)
			continue
		}
		id, err := subjects.ParseNodeID(info.Metadata[mesh.MetaNode])
		if err != nil || seen[id.String()] {
			continue
		}
		seen[id.String()] = true
		out = append(out, discovered{Name: id.Name, Node: id.String()})
	}
	slices.SortFunc(out, func(a, b discovered) int { return compareNodes(a.Node, b.Node) })
	return out, nil
}

// noNodes is the error for a discovery that found no node of --prefix: exit
// 3, naming the prefixes that other nodes serve, if any.
func (g *globals) noNodes() error {
	msg := fmt.Sprintf("no natsmesh node answered on prefix %s at %s", g.prefix, g.server)
	if len(g.otherPrefixes) > 0 {
		ps := slices.Compact(slices.Sorted(slices.Values(g.otherPrefixes)))
		msg += fmt.Sprintf(" (nodes serve other prefixes: %s; see --prefix)", strings.Join(ps, ", "))
	}
	return exitf(exitVerdict, "%s", msg)
}

// compareNodes orders "name.gen" strings by name, then numeric generation.
func compareNodes(a, b string) int {
	ia, erra := subjects.ParseNodeID(a)
	ib, errb := subjects.ParseNodeID(b)
	if erra != nil || errb != nil {
		switch {
		case a < b:
			return -1
		case a > b:
			return 1
		}
		return 0
	}
	if ia.Name != ib.Name {
		if ia.Name < ib.Name {
			return -1
		}
		return 1
	}
	switch {
	case ia.Generation < ib.Generation:
		return -1
	case ia.Generation > ib.Generation:
		return 1
	}
	return 0
}

// controlSubject is <prefix>.ctl.<name>.<verb>, as served by mesh.Node.
func (g *globals) controlSubject(name, verb string) string {
	return g.meshPrefix().Control(name, verb)
}

// serviceError returns the error a micro endpoint answered with, if any.
func serviceError(m *nats.Msg) error {
	if desc := m.Header.Get(micro.ErrorHeader); desc != "" {
		return fmt.Errorf("control error %s: %s", m.Header.Get(micro.ErrorCodeHeader), desc)
	}
	return nil
}

// control asks every discovered node for verb and decodes the JSON answers.
// Control subjects are per node name, and every generation alive under a
// name answers, so each name is asked once and its answers gathered. A node
// that left meanwhile (no responders) is skipped; a node that stays silent is
// a timeout (exit 4), returned with the answers that came.
func control[T any](ctx context.Context, g *globals, nc *nats.Conn, nodes []discovered, verb string) ([]T, error) {
	count := map[string]int{}
	var names []string
	for _, n := range nodes {
		if count[n.Name] == 0 {
			names = append(names, n.Name)
		}
		count[n.Name]++
	}
	type result struct {
		vals []T
		err  error
	}
	results := make([]result, len(names))
	var wg sync.WaitGroup
	for i, name := range names {
		wg.Go(func() {
			subject := g.controlSubject(name, verb)
			msgs, gone, err := gather(ctx, nc, subject, nil, count[name], g.timeout)
			if err != nil {
				results[i].err = natsError(err, "%s of node %s", verb, name)
				return
			}
			if gone {
				return // it left since discovery
			}
			if len(msgs) == 0 {
				results[i].err = exitf(exitTimeout, "node %s did not answer %s in %v", name, verb, g.timeout)
				return
			}
			for _, m := range msgs {
				if err := serviceError(m); err != nil {
					results[i].err = exitf(exitVerdict, "%s of node %s: %v", verb, name, err)
					return
				}
				var v T
				if err := json.Unmarshal(m.Data, &v); err != nil {
					results[i].err = exitf(exitVerdict, "%s of node %s: bad answer: %v", verb, name, err)
					return
				}
				results[i].vals = append(results[i].vals, v)
			}
		})
	}
	wg.Wait()
	var out []T
	var errs []error
	for _, r := range results {
		out = append(out, r.vals...)
		if r.err != nil {
			errs = append(errs, r.err)
		}
	}
	if len(errs) > 0 {
		return out, firstError(errs)
	}
	return out, nil
}

// firstError returns the first error of errs, noting how many more there are.
func firstError(errs []error) error {
	if len(errs) == 1 {
		return errs[0]
	}
	var ee *exitError
	code := exitVerdict
	if errors.As(errs[0], &ee) {
		code = ee.code
	}
	return exitf(code, "%v (and %s more)", errs[0], strconv.Itoa(len(errs)-1))
}
