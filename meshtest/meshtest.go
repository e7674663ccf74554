// Package meshtest is a conformance suite for natsmesh implementations: it
// checks, from the outside, that a running mesh follows the wire protocol of
// docs/protocol.md.
//
// The suite is a client and nothing more. It talks to the mesh over one
// NATS connection (two for the per-caller checks), through the ingress
// subjects <prefix>.in.<addr>.<stream> only, with the token encoding, the
// headers and the verdict table it reimplements from docs/protocol.md — it
// imports no natsmesh package — so it tests the protocol, not the Go code's
// own helpers, and any implementation (another language, another version)
// can run it:
//
//	func TestConformance(t *testing.T) {
//		nc, err := nats.Connect(url)
//		...
//		meshtest.Run(t, meshtest.Config{Conn: nc, Kinds: []string{meshtest.KindEcho, meshtest.KindKV}})
//	}
//
// Each check is a subtest named after its [Check.Name] (pick some with
// go test -run 'TestConformance/Dedupe'), documented with the sections of
// docs/protocol.md it pins. The checks use the built-in hub kinds of
// protocol.md §7 as probes: echo (almost every check) and kv (ordering,
// dedupe without a second run, fire-and-forget, handler verdicts); a check
// whose kind the implementation does not host is skipped. Every reply the
// suite reads goes through the same header rules (§4): a known verdict, a
// reason that agrees with it (always on Failed), a message on failures, a
// well-formed Mesh-Node, the caller's Mesh-Id echoed, and no answer key or
// window grant on an ingress reply.
//
// Given Config.Node, two more checks send on that node's delivery subject
// directly, as another node would: a windowed lane (§3.4: legs numbered in
// an epoch, the window grant, gaps, older epochs, duplicates) and the
// answer subject (§5: the answer key and the token binding a response to
// it).
//
// The checks use addresses unique to each run (kind/meshtest-<random>-…)
// and random delivery IDs, so they may run against a mesh that serves other
// traffic, and several runs may share one mesh. They wait only for replies
// (each bounded by [Config.Timeout]) and poll where a condition has no
// reply of its own; against a healthy one-node mesh the whole suite takes
// about two seconds, most of it the ingress's placement wait (§3.3) for an
// unhosted kind.
package meshtest

import (
	"fmt"
	"regexp"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// The built-in hub kinds of docs/protocol.md §7 the checks use as probes.
const (
	// KindEcho is "echo/<id>": a request's response is its payload; a plain
	// delivery is accepted and dropped.
	KindEcho = "echo"
	// KindKV is "kv/<id>": a map per address; Mesh-Type set (payload
	// KEY=VALUE), get (payload KEY, response the value) or delete.
	KindKV = "kv"
)

// DefaultPrefix is the subject prefix of protocol version 1 (§2.1).
const DefaultPrefix = "mesh.v1"

// DefaultTimeout bounds each request of the suite when Config.Timeout is
// zero: more than the ingress node's own request timeout (30 s), as §4.5
// advises, since the ingress may retry or wait for a response before it
// answers.
const DefaultTimeout = 35 * time.Second

// Config says where the mesh under test is and what it hosts.
type Config struct {
	// Conn is the connection the suite sends on, as an outside client of
	// the mesh would (headers and no_responders on: nats.go's defaults).
	// Required. The suite neither drains nor closes it.
	Conn *nats.Conn
	// Prefix is the mesh's subject prefix (§2.1); empty means
	// DefaultPrefix.
	Prefix string
	// Kinds are the built-in kinds (KindEcho, KindKV) the mesh hosts, with
	// the contracts of protocol.md §7. Nil means both, as meshd's default
	// --hubs echo,kv; an empty non-nil slice means none (only the checks
	// that need no hub run). Checks that need a kind not listed are skipped.
	Kinds []string
	// OtherCaller is a second connection that the mesh identifies as
	// another caller than Conn (§3.3): with the default caller identity
	// (the reply's inbox prefix) a connection with another inbox prefix
	// (nats.CustomInboxPrefix), with tenant accounts another user. Nil
	// skips the checks of per-caller dedupe scope.
	OtherCaller *nats.Conn
	// Node is a node generation of the mesh, "<name>.<gen>" as
	// Mesh-Node and `meshctl nodes` write it, for the checks of the direct
	// delivery subject (§2.2, §3.4 windowed lanes, §5 answers): what a
	// sender that knows the owner sees. Empty skips them.
	Node string
	// NodeConn is the connection those checks send on: under the
	// permission profiles (SECURITY.md) only a node's user may publish on
	// delivery subjects and subscribe to answer subjects. Nil means Conn.
	NodeConn *nats.Conn
	// Timeout bounds each request the suite sends, and each condition it
	// polls for; zero means DefaultTimeout. A reply not received in time
	// fails the check.
	Timeout time.Duration
}

// Check is one conformance check of the suite.
type Check struct {
	// Name is the subtest's name under Run, e.g. "Dedupe".
	Name string
	// Sections are the sections of docs/protocol.md the check pins, e.g.
	// "§3.2".
	Sections string
	// Kinds are the built-in kinds the check needs; it skips itself when
	// Config.Kinds lacks one.
	Kinds []string
	// Func runs the check against the mesh of cfg, reporting failures on t
	// (Errorf for each wrong reply, Fatalf when it cannot go on). It blocks
	// until every request it sent is answered or timed out. cfg is taken
	// as given to Run (defaults applied by Func itself).
	Func func(t testing.TB, cfg Config)
}

// Checks returns the suite's checks in the order Run runs them; each call
// returns a new slice. Running one check's Func on its own is equivalent to
// selecting it with -run.
func Checks() []Check {
	return slices.Clone(checks)
}

// Run runs every check of Checks against the mesh of cfg, each as a subtest
// of t named after it, one after another. It returns when all are done. A
// Config without Conn or with an invalid Prefix fails t at once.
func Run(t *testing.T, cfg Config) {
	t.Helper()
	if _, err := cfg.normalized(); err != nil {
		t.Fatalf("meshtest: %v", err)
	}
	for _, c := range checks {
		t.Run(c.Name, func(t *testing.T) { c.Func(t, cfg) })
	}
}

var prefixToken = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// normalized returns cfg with its defaults applied, or an error if cfg
// cannot be used.
func (cfg Config) normalized() (Config, error) {
	if cfg.Conn == nil {
		return cfg, fmt.Errorf("Config.Conn is nil")
	}
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	if err := validPrefix(cfg.Prefix); err != nil {
		return cfg, err
	}
	if cfg.Kinds == nil {
		cfg.Kinds = []string{KindEcho, KindKV}
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	return cfg, nil
}

// validPrefix applies §2.1: 1–128 bytes of dot-separated tokens, each
// [A-Za-z0-9_-]+.
func validPrefix(p string) error {
	if len(p) < 1 || len(p) > 128 {
		return fmt.Errorf("prefix %q: must be 1-128 bytes (§2.1)", p)
	}
	start := 0
	for i := 0; i <= len(p); i++ {
		if i == len(p) || p[i] == '.' {
			if !prefixToken.MatchString(p[start:i]) {
				return fmt.Errorf("prefix %q: token %q is not [A-Za-z0-9_-]+ (§2.1)", p, p[start:i])
			}
			start = i + 1
		}
	}
	return nil
}
