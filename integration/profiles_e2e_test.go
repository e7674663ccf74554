package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/natsmesh/natsmesh/daemon"
	"github.com/natsmesh/natsmesh/mesh/membership"
)

// docsOperations is docs/operations.md, the text these tests run.
func docsOperations(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// docsAccounts extracts the production accounts section from
// docs/operations.md: the first code block after the heading "External
// cluster: the accounts section" (a copy in a test would not prove the
// docs right).
func docsAccounts(t *testing.T, doc string) string {
	t.Helper()
	const heading = "### External cluster: the accounts section"
	i := strings.Index(doc, heading)
	if i < 0 {
		t.Fatalf("docs/operations.md has no %q", heading)
	}
	rest := doc[i:]
	a := strings.Index(rest, "```\n")
	if a < 0 {
		t.Fatal("no code block after " + heading)
	}
	rest = rest[a+4:]
	b := strings.Index(rest, "```\n")
	if b < 0 || !strings.HasPrefix(rest, "accounts {") {
		t.Fatalf("the code block after %q is not an accounts section", heading)
	}
	return rest[:b]
}

// docsProfiles reads, from the profile table of docs/operations.md §5,
// which profile the docs name for each meshctl command: the row whose "used
// by" cell names it.
func docsProfiles(t *testing.T, doc string, commands []string) map[string]string {
	t.Helper()
	out := map[string]string{}
	row := regexp.MustCompile(`(?m)^\| (node|operator|client) \|.*\| ([^|]*) \|$`)
	rows := row.FindAllStringSubmatch(doc, -1)
	for _, c := range commands {
		for _, r := range rows {
			if strings.Contains(r[2], "meshctl") && regexp.MustCompile(`\b`+regexp.QuoteMeta(c)+`\b`).MatchString(r[2]) {
				out[c] = r[1]
				break
			}
		}
		if out[c] == "" {
			t.Fatalf("docs/operations.md's profile table names no profile for meshctl %s", c)
		}
	}
	return out
}

// meshctlCommands are the commands the end-to-end tests run under the
// profile the docs name for each.
var meshctlCommands = []string{"nodes", "hubs", "stats", "send", "request", "state get", "bench", "subscribe", "drain"}

// credentials are meshctl's login flags for each profile.
type credentials map[string][]string

// departedRe matches a meshd's JSON log line saying a node departed.
var departedRe = regexp.MustCompile(`^.*"msg":"node departed".*$`)

// departure waits until md logs that a generation of name departed, and
// returns how (membership.EventType's name) and when, by md's log clock.
func departure(t *testing.T, md *Meshd, name string, timeout time.Duration) (how string, at time.Time) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		line := md.WaitLine(t, departedRe, time.Until(deadline))[0]
		var l struct {
			Time     time.Time `json:"time"`
			Departed string    `json:"departed"`
			How      string    `json:"how"`
		}
		if err := json.Unmarshal([]byte(line), &l); err != nil {
			t.Fatalf("departure log line %q: %v", line, err)
		}
		if strings.HasPrefix(l.Departed, name+".") {
			return l.How, l.Time
		}
	}
}

// waitMembers polls meshctl nodes -o json (as login) until n nodes answer,
// each seeing n members.
func waitMembers(t *testing.T, url string, login []string, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		out, _, code := Run(t, 30*time.Second, nil, Build(t).Meshctl, append(append([]string{"-s", url}, login...), "-o", "json", "nodes")...)
		var st []struct {
			Membership *struct {
				Members []json.RawMessage `json:"members"`
			} `json:"membership"`
		}
		if code == 0 && json.Unmarshal([]byte(out), &st) == nil && len(st) == n {
			all := true
			for _, s := range st {
				all = all && s.Membership != nil && len(s.Membership.Members) == n
			}
			if all {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d nodes do not see each other after 20s: exit %d\n%s", n, code, out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// noViolations fails if a meshd logged a NATS async error (a permission
// violation) or a line naming one. Two async errors are JetStream consumer
// lifecycle, not permissions, and are only logged: nats.go reports a
// consumer it could not find or that went quiet (an ordered consumer it
// re-creates; met once in a full parallel suite run under load).
func noViolations(t *testing.T, nodes ...*Meshd) {
	t.Helper()
	for _, md := range nodes {
		for _, l := range strings.Split(md.Stdout()+md.Stderr(), "\n") {
			lower := strings.ToLower(l)
			switch {
			case strings.Contains(lower, "permissions violation"):
			case strings.Contains(l, "NATS async error") &&
				(strings.Contains(l, `"nats: consumer not found"`) || strings.Contains(l, `"nats: consumer not active"`)):
				t.Logf("meshd %s: %s (JetStream consumer lifecycle, not a permission)", md.Node, l)
				continue
			case strings.Contains(l, "NATS async error"):
			default:
				continue
			}
			t.Errorf("meshd %s logged a permission violation: %s", md.Node, l)
		}
	}
}

// checkProfiles runs every meshctl command with the profile the docs name
// for it (must succeed), forbidden operations (must fail at once with one
// line naming the permission and the profile), a SIGKILL of victim (must be
// departed by the advisory within 100 ms, seen by watcher) and drains.
func checkProfiles(t *testing.T, url string, creds credentials, watcher, victim *Meshd, drainAs string, drained *Meshd) {
	t.Helper()
	doc := docsOperations(t)
	prof := docsProfiles(t, doc, meshctlCommands)
	ctl := func(profile string, args ...string) (string, string, int, time.Duration) {
		t.Helper()
		start := time.Now()
		a := append([]string{"-s", url, "--timeout", "20s"}, creds[profile]...)
		out, errOut, code := Run(t, 60*time.Second, nil, Build(t).Meshctl, append(a, args...)...)
		return out, errOut, code, time.Since(start)
	}
	ok := func(command string, args ...string) string {
		t.Helper()
		out, errOut, code, _ := ctl(prof[command], args...)
		if code != 0 {
			t.Fatalf("meshctl %s as %s (the profile the docs name): exit %d\n%s%s", strings.Join(args, " "), prof[command], code, out, errOut)
		}
		return out
	}
	// The nodes seen through the operator's eyes.
	var st []struct {
		Name string `json:"name"`
	}
	if err := json.Unmarshal([]byte(ok("nodes", "-o", "json", "nodes")), &st); err != nil || len(st) == 0 {
		t.Fatalf("meshctl nodes -o json: %v %+v", err, st)
	}
	if out := ok("hubs", "hubs"); !strings.Contains(out, "echo") {
		t.Fatalf("meshctl hubs:\n%s", out)
	}
	ok("stats", "stats")
	if out := ok("send", "send", "echo/e2e", "hello"); !strings.Contains(out, "Accepted") {
		t.Fatalf("meshctl send:\n%s", out)
	}
	if out := ok("request", "request", "echo/e2e", "ping"); !strings.Contains(out, "ping") {
		t.Fatalf("meshctl request:\n%s", out)
	}
	// A caller with the client profile reaches the ingress too.
	if out, errOut, code, _ := ctl("client", "request", "echo/e2e", "from-a-caller"); code != 0 || !strings.Contains(out, "from-a-caller") {
		t.Fatalf("meshctl request as client: exit %d\n%s%s", code, out, errOut)
	}
	ok("request", "request", "kv/settings", "--type", "set", "colour=blue")
	if out := ok("state get", "state", "get", "kv/settings"); !strings.Contains(out, "colour") {
		t.Fatalf("meshctl state get:\n%s", out)
	}
	if out := ok("subscribe", "subscribe", "kv/settings", "--count", "1"); !strings.Contains(out, "colour") {
		t.Fatalf("meshctl subscribe:\n%s", out)
	}
	ok("bench", "bench", "-n", "200", "-c", "4", "--to", "echo/bench")

	// Forbidden: at once, one line, naming the permission and the profile
	// the command needs.
	forbidden := []struct {
		profile, command string
		args             []string
	}{
		{"client", "nodes", []string{"nodes"}},
		{"client", "state get", []string{"state", "get", "kv/settings"}},
		{"client", "drain", []string{"drain", "nobody"}},
		{"operator", "subscribe", []string{"subscribe", "kv/settings", "--count", "1"}},
		{"operator", "bench", []string{"bench", "-n", "10"}},
	}
	var slowest time.Duration
	for _, f := range forbidden {
		if f.profile == prof[f.command] {
			t.Fatalf("the docs name %s for %s: not a forbidden case", f.profile, f.command)
		}
		out, errOut, code, took := ctl(f.profile, f.args...)
		slowest = max(slowest, took)
		msg := strings.TrimSpace(errOut)
		if code != 2 || strings.Contains(msg, "\n") || !strings.Contains(msg, "permissions violation") ||
			!strings.Contains(msg, "needs the "+prof[f.command]+" profile") || took > 5*time.Second {
			t.Errorf("meshctl %s as %s: exit %d after %v, stderr %q (want exit 2 at once, one line naming the permission and the %s profile)\n%s",
				strings.Join(f.args, " "), f.profile, code, took.Round(time.Millisecond), msg, prof[f.command], out)
		}
	}

	t.Logf("forbidden operations refused in at most %v (meshctl --timeout 20s)", slowest.Round(time.Millisecond))

	// A SIGKILLed meshd is departed by the advisory within 100 ms.
	killed := time.Now()
	if err := victim.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	how, at := departure(t, watcher, strings.SplitN(victim.Node, ".", 2)[0], 15*time.Second)
	took := at.Sub(killed)
	t.Logf("SIGKILLed %s departed at %s after %v (%s)", victim.Node, watcher.Node, took, how)
	if how != membership.Disconnected.String() || took > 100*time.Millisecond {
		t.Errorf("SIGKILLed %s departed after %v by %s, want within 100ms by the advisory (%s)", victim.Node, took, how, membership.Disconnected)
	}

	// drain as the docs' profile, and as the node user: exit 0 once the
	// drain worked.
	name := strings.SplitN(drained.Node, ".", 2)[0]
	if out, errOut, code, _ := ctl(drainAs, "drain", name); code != 0 {
		t.Errorf("meshctl drain %s as %s: exit %d\n%s%s", name, drainAs, code, out, errOut)
	}
	if code := drained.Wait(t, 30*time.Second); code != 0 {
		t.Errorf("drained meshd exit code %d", code)
	}
}

// TestDocumentedProductionSetup (issue 22 item 7): three clustered
// nats-server processes configured with the accounts section of
// docs/operations.md (the production, multi-account mode, extracted from
// the document), three meshd with the node user, and meshctl with each
// profile the docs name: each node's advisory self-check passes, every
// command works with its profile, a
// forbidden one fails at once on one line naming the permission and the
// profile, no node logs a permission violation (nor does any server about
// a node), a SIGKILLed meshd is departed within 100 ms by the advisory of
// the account the nodes run in, and drain exits 0 for the operator and
// for the node user.
func TestDocumentedProductionSetup(t *testing.T) {
	t.Parallel()
	pw := map[string]string{"node": "e2e-node-pw", "operator": "e2e-operator-pw", "client": "e2e-client-pw"}
	var env []string // the servers read the passwords from their environment, as the docs say
	for u, p := range pw {
		env = append(env, "NATSMESH_"+strings.ToUpper(u)+"_PASSWORD="+p)
	}
	c := StartClusterWithAccountsEnv(t, 3, docsAccounts(t, docsOperations(t)), env)
	c.WaitReady(t)
	creds := credentials{}
	for u, p := range pw {
		creds[u] = []string{"--user", u, "--password", p}
	}
	var nodes []*Meshd
	for i := range 3 {
		nodes = append(nodes, StartMeshd(t, "--name", fmt.Sprintf("e2e-%d", i), "--nats-url", c.URL(), "--user", "node", "--password", pw["node"],
			"--http", "", "--hubs", "echo,kv", "--kv-replicas", "3"))
	}
	for _, md := range nodes {
		if !strings.Contains(md.Stderr(), `"subject":"`+daemon.AdvisorySubjectEmbedded+`"`) {
			t.Errorf("meshd %s does not listen on the advisory of its account MESH:\n%s", md.Node, md.Stderr())
		}
		// Its self-check saw them arrive: the docs' accounts import them.
		// Printed just after the serving line StartMeshd waited for, on the
		// other pipe: it may have reached that wait first.
		md.WaitPrinted(t, regexp.MustCompile(`"msg":"disconnect advisories verified`), 20*time.Second)
	}
	waitMembers(t, c.URL(), creds["operator"], 3)
	serverLogs := func() string {
		var b strings.Builder
		for i := range c.N() {
			if c.Server(i).NATSServer != nil {
				b.WriteString(c.Server(i).Stderr())
			}
		}
		return b.String()
	}
	checkProfiles(t, c.URL(), creds, nodes[0], nodes[2], "node", nodes[1])

	// After a reconnect too: the surviving node's server dies, it
	// reconnects to another and re-sends its subscriptions; once it
	// answers a ping after that, the server has taken them (in order on
	// that connection) and any refusal has been reported.
	var i int
	for i = range c.N() {
		if strings.HasSuffix(nodes[0].NATSURL, fmt.Sprintf(":%d", c.Server(i).ClientPort)) {
			break
		}
	}
	before := serverLogs()
	c.Kill(i)
	nodes[0].WaitLine(t, regexp.MustCompile(`"msg":"NATS reconnected"`), 20*time.Second)
	name := strings.SplitN(nodes[0].Node, ".", 2)[0]
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, _, code := Run(t, 30*time.Second, nil, Build(t).Meshctl, append(append([]string{"-s", c.URL(), "--timeout", "2s"}, creds["operator"]...), "hubs")...)
		if code == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s does not answer after its reconnect", name)
		}
		time.Sleep(50 * time.Millisecond)
	}
	noViolations(t, nodes...)
	for _, l := range strings.Split(before+serverLogs(), "\n") {
		if strings.Contains(l, "Violation") && strings.Contains(l, `natsmesh e2e-`) {
			t.Errorf("a server logged a violation by a node: %s", l)
		}
	}
}

// TestMeshdAuthProfiles (issue 22 item 7): the same on meshd --auth's
// embedded server, whose accounts are the same production mode with
// generated nkeys: meshctl with each profile's seed, a second meshd joined
// with the node seed and SIGKILLed, departed within 100 ms by the advisory.
func TestMeshdAuthProfiles(t *testing.T) {
	longTest(t)
	dir := t.TempDir()
	first := StartMeshd(t, "--name", "auth-0", "--auth", "--listen", "127.0.0.1:0", "--http", "", "--data-dir", dir, "--hubs", "echo,kv")
	seeds := filepath.Join(dir, daemon.AuthDirName)
	creds := credentials{
		"node":     {"--nkey", filepath.Join(seeds, daemon.NodeSeedFile)},
		"operator": {"--nkey", filepath.Join(seeds, daemon.OperatorSeedFile)},
		"client":   {"--nkey", filepath.Join(seeds, daemon.ClientSeedFile)},
	}
	second := StartMeshd(t, "--name", "auth-1", "--nats-url", first.NATSURL, "--nkey", filepath.Join(seeds, daemon.NodeSeedFile), "--http", "", "--hubs", "echo")
	third := StartMeshd(t, "--name", "auth-2", "--nats-url", first.NATSURL, "--nkey", filepath.Join(seeds, daemon.NodeSeedFile), "--http", "", "--hubs", "echo")
	waitMembers(t, first.NATSURL, creds["operator"], 3)
	checkProfiles(t, first.NATSURL, creds, first, second, "operator", third)
	noViolations(t, first, second, third)
}
