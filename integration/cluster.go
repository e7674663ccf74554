package integration

import (
	"fmt"
	"github.com/natsmesh/natsmesh/daemon"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// ClusterAccountsConf is the account configuration of every server of a
// Cluster: the same as meshd's embedded server and docs/operations.md.
const ClusterAccountsConf = daemon.AccountsConf

// ClusterAdvisorySubject is the disconnect advisory as a MESH client
// subscribes to it.
const ClusterAdvisorySubject = daemon.AdvisorySubjectEmbedded

// Cluster is a cluster of nats-server processes joined by routes, with
// JetStream, the accounts of ClusterAccountsConf, and ping_interval 500ms /
// ping_max 2 so a frozen client is dropped in about 1.2 s.
type Cluster struct {
	Name    string // the cluster's name ("mesh" for StartCluster)
	t       testing.TB
	bin     string
	servers []*ClusterServer
	// logDir, when set (KeepLogs), receives each server start's log.
	logDir string
	starts map[int]int // server index → starts so far, to name its logs
	env    []string    // added to each server process's environment
}

// ClusterServer is one server of a Cluster. Its embedded *NATSServer is
// nil while it is killed, and replaced by Restart.
type ClusterServer struct {
	*NATSServer
	Name        string
	ConfigFile  string
	StoreDir    string
	ClientPort  int
	ClusterPort int
	MonitorPort int
	GatewayPort int // 0 unless the cluster is part of a supercluster
	// GatewayProxy fronts GatewayPort: every gateway connection to this
	// server passes it (nil unless the cluster is part of a supercluster).
	GatewayProxy *Proxy
	LeafPort     int // the leafnodes listener: 0 unless StartLeafHubCluster
	// RouteProxies[j] fronts server j's cluster port for the routes this
	// server dials (nil unless the cluster was started with route proxies):
	// Cluster.Isolate cuts a server off from the others, its clients still
	// attached.
	RouteProxies map[int]*Proxy
}

// StartCluster starts n nats-server processes (built from go.mod) forming the
// cluster "mesh" on loopback, each with a generated config file and its own
// JetStream store in t.TempDir(), and waits until each accepts clients.
// Call WaitReady before using JetStream.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	return StartClusterWithAccounts(t, n, ClusterAccountsConf)
}

// StartClusterWithAccounts is StartCluster with accounts as the servers'
// accounts section instead of ClusterAccountsConf (e.g. the production
// section of docs/operations.md; the servers read any $VARIABLE in it from
// the environment of the test process).
func StartClusterWithAccounts(t testing.TB, n int, accounts string) *Cluster {
	t.Helper()
	return StartClusterWithAccountsEnv(t, n, accounts, nil)
}

// StartClusterWithAccountsEnv is StartClusterWithAccounts with env
// ("KEY=value") added to each server process's environment, e.g. the
// passwords an accounts section reads as $VARIABLES (the way
// docs/operations.md has a production server read them), without
// t.Setenv, so that the test may run in parallel.
func StartClusterWithAccountsEnv(t testing.TB, n int, accounts string, env []string) *Cluster {
	t.Helper()
	if n < 1 {
		t.Fatalf("StartCluster: n = %d", n)
	}
	// Free ports are picked, released, then bound by the servers: another
	// process may take one in between. Start afresh with new ports then.
	for attempt := 1; ; attempt++ {
		c, err := startCluster(t, n, accounts, env)
		if err == nil {
			return c
		}
		c.stopAll()
		if attempt == 3 {
			t.Fatalf("StartCluster: %v", err)
		}
		t.Logf("StartCluster: %v; retrying with new ports", err)
	}
}

func (c *Cluster) stopAll() {
	for _, s := range c.servers {
		if s.NATSServer != nil {
			_ = s.Process.Cmd.Process.Kill()
		}
	}
}

func startCluster(t testing.TB, n int, accounts string, env []string) (*Cluster, error) {
	cs, err := startClusters(t, []clusterSpec{{name: "mesh", n: n, jetstream: true, env: env}}, accounts)
	return cs[0], err
}

// clusterSpec describes one cluster of startClusters.
type clusterSpec struct {
	name      string // cluster (and gateway) name; servers are <name>-<i>
	n         int
	jetstream bool
	leaf      bool // a hub for leaf nodes: a leafnodes listener and the mesh account's default JetStream domain
	// routeProxies: every route from server i to server j goes through a
	// proxy of its own (i→j), and servers advertise no usable route URL, so
	// that no implicit route bypasses the proxies.
	routeProxies bool
	env          []string // added to each server process's environment
}

// StartLeafHubCluster is StartCluster for a hub of leaf nodes (DESIGN §12):
// every server also listens for leaf connections (ClusterServer.LeafPort;
// a leaf binds the mesh account: no_auth_user) and has the mesh account's
// JetStream as its default domain for leaf traffic, the line
// docs/operations.md ("Leaf nodes") gives operators:
//
//	default_js_domain: {MESH: ""}
func StartLeafHubCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	for attempt := 1; ; attempt++ {
		cs, err := startClusters(t, []clusterSpec{{name: "mesh", n: n, jetstream: true, leaf: true}}, ClusterAccountsConf)
		if err == nil {
			return cs[0]
		}
		for _, c := range cs {
			c.stopAll()
		}
		if attempt == 3 {
			t.Fatalf("StartLeafHubCluster: %v", err)
		}
		t.Logf("StartLeafHubCluster: %v; retrying with new ports", err)
	}
}

// LeafHubConf is what a hub's servers need for leaf mesh nodes besides a
// leafnodes listener (docs/operations.md, "Leaf nodes").
const LeafHubConf = `default_js_domain: {MESH: ""}`

// startClusters writes the configs of every server of specs (joined by
// gateways when there are several clusters) and starts them all. On error
// the clusters made so far are returned, for stopAll. accounts is the
// account part of every config.
func startClusters(t testing.TB, specs []clusterSpec, accounts string) ([]*Cluster, error) {
	bin := Build(t).NATSServer
	dir := t.TempDir()
	var cs []*Cluster
	gw := len(specs) > 1
	for _, sp := range specs {
		c := &Cluster{t: t, bin: bin, Name: sp.name, env: sp.env}
		for i := range sp.n {
			s := &ClusterServer{
				Name:        fmt.Sprintf("%s-%d", sp.name, i),
				ClientPort:  FreePort(t),
				ClusterPort: FreePort(t),
				MonitorPort: FreePort(t),
				StoreDir:    filepath.Join(dir, fmt.Sprintf("%s-%d-store", sp.name, i)),
			}
			if sp.leaf {
				s.LeafPort = FreePort(t)
			}
			if gw {
				// Every gateway connection to s goes through its proxy
				// (the remotes' URLs and s's advertised gateway URL name
				// it), so a test can cut the clusters apart with their
				// servers up (Supercluster.CutGateways).
				s.GatewayPort = FreePort(t)
				s.GatewayProxy = StartProxy(t, fmt.Sprintf("127.0.0.1:%d", s.GatewayPort))
			}
			s.ConfigFile = filepath.Join(dir, s.Name+".conf")
			c.servers = append(c.servers, s)
		}
		cs = append(cs, c)
	}
	for ci, c := range cs {
		for i, s := range c.servers {
			var routes []string
			advertise := ""
			for j, o := range c.servers {
				if j != i {
					if specs[ci].routeProxies {
						if s.RouteProxies == nil {
							s.RouteProxies = map[int]*Proxy{}
						}
						p := StartProxy(t, fmt.Sprintf("127.0.0.1:%d", o.ClusterPort))
						s.RouteProxies[j] = p
						routes = append(routes, fmt.Sprintf("    nats-route://%s", p.Addr))
						continue
					}
					routes = append(routes, fmt.Sprintf("    nats-route://127.0.0.1:%d", o.ClusterPort))
				}
			}
			if specs[ci].routeProxies {
				// Gossiped route URLs lead nowhere: only the proxied explicit
				// routes connect. no_advertise: clients are told no other
				// server's client URL, so a client reconnects only to the
				// URLs it was given — a test's proxies, or the servers it
				// was meant to reach — and a link cut or a route cut holds.
				advertise = fmt.Sprintf("  advertise: \"127.0.0.1:%d\"\n  no_advertise: true\n", FreePort(t))
			}
			js := ""
			if specs[ci].jetstream {
				js = fmt.Sprintf("jetstream {\n  store_dir: %q\n}\n", s.StoreDir)
			}
			if specs[ci].leaf {
				// no_advertise: a leaf reconnects only to the URLs it was
				// given (a test's proxy), not to every hub server's.
				js += fmt.Sprintf("leafnodes {\n  listen: 127.0.0.1:%d\n  no_advertise: true\n}\n%s\n", s.LeafPort, LeafHubConf)
			}
			gateway := ""
			if gw {
				var remotes []string
				for _, o := range cs {
					if o == c {
						continue
					}
					var urls []string
					for _, os := range o.servers {
						urls = append(urls, fmt.Sprintf("%q", os.GatewayProxy.URL()))
					}
					remotes = append(remotes, fmt.Sprintf("    {name: %s, urls: [%s]}", o.Name, strings.Join(urls, ", ")))
				}
				gateway = fmt.Sprintf("\ngateway {\n  name: %s\n  listen: 127.0.0.1:%d\n  advertise: %q\n  gateways: [\n%s\n  ]\n}\n", c.Name, s.GatewayPort, s.GatewayProxy.Addr, strings.Join(remotes, "\n"))
			}
			conf := fmt.Sprintf(`# generated by integration.StartCluster
server_name: %s
listen: 127.0.0.1:%d
http: 127.0.0.1:%d

# A frozen client is closed after two unanswered pings, ~1.2 s.
ping_interval: "500ms"
ping_max: 2

# Lame duck (SIGUSR2): clients are closed one by one after 1 s, at most
# 1 s apart (the 30 s duration is the server's minimum).
lame_duck_duration: "30s"
lame_duck_grace_period: "1s"

%s
cluster {
  name: %s
  listen: 127.0.0.1:%d
%s  routes: [
%s
  ]
}
%s
%s`, s.Name, s.ClientPort, s.MonitorPort, js, c.Name, s.ClusterPort, advertise, strings.Join(routes, "\n"), gateway, accounts)
			if err := os.WriteFile(s.ConfigFile, []byte(conf), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, c := range cs {
		for i := range c.servers {
			if err := c.tryStart(i); err != nil {
				return cs, err
			}
		}
	}
	return cs, nil
}

func (c *Cluster) start(i int) {
	c.t.Helper()
	if err := c.tryStart(i); err != nil {
		c.t.Fatal(err)
	}
}

// tryStart runs server i and waits until it accepts clients and routes
// (and gateways and leaf nodes, if it listens for them), or fails if it
// exits first (e.g. a port was taken) or takes over 15 s. The server binds
// its route port after it reports itself ready for clients, and exits if
// that port was taken (CI: "Error listening on router port … address
// already in use" after "Server is ready"), so accepting clients alone
// is not proof it runs.
func (c *Cluster) tryStart(i int) error {
	s := c.servers[i]
	p := StartEnv(c.t, c.env, c.bin, "-c", s.ConfigFile)
	s.NATSServer = &NATSServer{Process: p, URL: fmt.Sprintf("nats://127.0.0.1:%d", s.ClientPort)}
	c.keepLog(i, p)
	ports := []int{s.ClientPort, s.ClusterPort}
	for _, port := range []int{s.GatewayPort, s.LeafPort} {
		if port != 0 {
			ports = append(ports, port)
		}
	}
	deadline := time.Now().Add(15 * time.Second)
	for _, port := range ports {
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		for {
			if conn, err := net.DialTimeout("tcp", addr, 200*time.Millisecond); err == nil {
				conn.Close()
				break
			}
			select {
			case <-p.done:
				return fmt.Errorf("%s exited before serving on %s: %s", s.Name, addr, lastLine(p.Stderr()))
			default:
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%s not serving on %s after 15s", s.Name, addr)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return nil
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

// StartClusterRouteProxies is StartCluster with every route through a
// proxy of its own (clusterSpec.routeProxies), for Isolate.
func StartClusterRouteProxies(t testing.TB, n int) *Cluster {
	t.Helper()
	for attempt := 1; ; attempt++ {
		cs, err := startClusters(t, []clusterSpec{{name: "mesh", n: n, jetstream: true, routeProxies: true}}, ClusterAccountsConf)
		if err == nil {
			return cs[0]
		}
		cs[0].stopAll()
		if attempt == 3 {
			t.Fatalf("StartClusterRouteProxies: %v", err)
		}
	}
}

// Isolate cuts every route between server i and the others in mode (its
// clients stay connected to it); Heal restores them. It returns when the
// routes in effect stopped: the latest time any of their proxies moved
// bytes (Proxy.Cut), at most now.
func (c *Cluster) Isolate(i int, mode CutMode) time.Time {
	var stopped time.Time
	cut := func(p *Proxy) {
		if at := p.Cut(mode); at.After(stopped) {
			stopped = at
		}
	}
	for j, s := range c.servers {
		if j == i {
			for _, p := range s.RouteProxies {
				if p != nil {
					cut(p)
				}
			}
			continue
		}
		if p := s.RouteProxies[i]; p != nil {
			cut(p)
		}
	}
	return stopped
}

// Heal restores what Isolate(i) cut.
func (c *Cluster) Heal(i int) {
	for j, s := range c.servers {
		if j == i {
			for _, p := range s.RouteProxies {
				p.Restore()
			}
			continue
		}
		if p := s.RouteProxies[i]; p != nil {
			p.Restore()
		}
	}
}

// N is the number of servers.
func (c *Cluster) N() int { return len(c.servers) }

// Server returns server i.
func (c *Cluster) Server(i int) *ClusterServer { return c.servers[i] }

// URLs returns the client URLs of all servers, killed ones included.
func (c *Cluster) URLs() []string {
	out := make([]string, len(c.servers))
	for i, s := range c.servers {
		out[i] = fmt.Sprintf("nats://127.0.0.1:%d", s.ClientPort)
	}
	return out
}

// URL returns the client URLs comma-joined, as nats.Connect takes them.
func (c *Cluster) URL() string { return strings.Join(c.URLs(), ",") }

// Index returns the index of the server named name, or -1.
func (c *Cluster) Index(name string) int {
	for i, s := range c.servers {
		if s.Name == name {
			return i
		}
	}
	return -1
}

// KeepLogs makes every server of c, from now on, leave its log (what the
// server printed: nats-server logs to stderr) in dir when the test ends, one
// file per start: <server>.<start>.log, the running ones included. A
// long run that stalls in JetStream can then be read afterwards. dir must
// exist; a log whose dir is gone by then (a run that removed it on
// success) is not written. Not safe for concurrent use with Restart.
func (c *Cluster) KeepLogs(dir string) {
	c.logDir = dir
	for i, s := range c.servers {
		if s.NATSServer != nil {
			c.keepLog(i, s.Process)
		}
	}
}

// keepLog registers the writing of server i's log p at the end of the
// test, if c keeps logs.
func (c *Cluster) keepLog(i int, p *Process) {
	if c.logDir == "" {
		return
	}
	if c.starts == nil {
		c.starts = map[int]int{}
	}
	c.starts[i]++
	keepProcessLog(c.t, p, filepath.Join(c.logDir, fmt.Sprintf("%s.%d.log", c.servers[i].Name, c.starts[i])))
}

// Kill sends SIGKILL to server i and waits for it to exit.
func (c *Cluster) Kill(i int) {
	c.t.Helper()
	s := c.servers[i]
	if s.NATSServer == nil {
		c.t.Fatalf("Kill(%d): %s is not running", i, s.Name)
	}
	if err := s.Signal(syscall.SIGKILL); err != nil {
		c.t.Fatalf("kill %s: %v", s.Name, err)
	}
	s.Wait(c.t, 10*time.Second)
	s.NATSServer = nil
}

// Restart starts server i again with the same config file and store (after
// Kill, or after it died) and waits until it accepts clients.
func (c *Cluster) Restart(i int) {
	c.t.Helper()
	s := c.servers[i]
	if s.NATSServer != nil {
		select {
		case <-s.done:
		default:
			c.t.Fatalf("Restart(%d): %s is still running", i, s.Name)
		}
	}
	c.start(i)
}

// WaitReady waits until every running server answers 200 on its full
// /healthz: JetStream is enabled, the server is in contact with a meta
// leader and its assets are current.
func (c *Cluster) WaitReady(t testing.TB) {
	t.Helper()
	const timeout = 30 * time.Second
	deadline := time.Now().Add(timeout)
	client := &http.Client{Timeout: time.Second}
	for _, s := range c.servers {
		if s.NATSServer == nil {
			continue
		}
		url := fmt.Sprintf("http://127.0.0.1:%d/healthz", s.MonitorPort)
		for {
			code, body := 0, ""
			resp, err := client.Get(url)
			if err == nil {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				code, body = resp.StatusCode, strings.TrimSpace(string(b))
			} else {
				body = err.Error()
			}
			if code == http.StatusOK {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s not healthy after %v: %d %s\nstderr:\n%s", s.Name, timeout, code, body, s.Stderr())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// LogJetStream logs each running server's view of JetStream from its
// monitoring endpoint (/jsz): the meta leader and, per stream, its leader,
// last sequence and replicas (current, lag, offline, last active). Tests
// call it when they fail, to show the NATS side of a stuck node.
func (c *Cluster) LogJetStream(t testing.TB) {
	t.Helper()
	type replica struct {
		Name    string        `json:"name"`
		Current bool          `json:"current"`
		Offline bool          `json:"offline"`
		Active  time.Duration `json:"active"`
		Lag     uint64        `json:"lag"`
	}
	var jsz struct {
		Meta *struct {
			Leader string `json:"leader"`
		} `json:"meta_cluster"`
		Accounts []struct {
			Name    string `json:"name"`
			Streams []struct {
				Name    string `json:"name"`
				Cluster *struct {
					Leader   string    `json:"leader"`
					Replicas []replica `json:"replicas"`
				} `json:"cluster"`
				State struct {
					LastSeq uint64 `json:"last_seq"`
				} `json:"state"`
			} `json:"stream_detail"`
		} `json:"account_details"`
	}
	client := &http.Client{Timeout: 2 * time.Second}
	for _, s := range c.servers {
		if s.NATSServer == nil {
			t.Logf("jsz %s: not running", s.Name)
			continue
		}
		resp, err := client.Get(fmt.Sprintf("http://127.0.0.1:%d/jsz?accounts=true&streams=true", s.MonitorPort))
		if err != nil {
			t.Logf("jsz %s: %v", s.Name, err)
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		jsz.Meta, jsz.Accounts = nil, nil
		if err := jsonUnmarshal(b, &jsz); err != nil {
			t.Logf("jsz %s: %v", s.Name, err)
			continue
		}
		var sb strings.Builder
		if jsz.Meta != nil {
			fmt.Fprintf(&sb, "meta leader %s", jsz.Meta.Leader)
		}
		for _, a := range jsz.Accounts {
			for _, st := range a.Streams {
				fmt.Fprintf(&sb, "\n  %s/%s last_seq %d", a.Name, st.Name, st.State.LastSeq)
				if cl := st.Cluster; cl != nil {
					fmt.Fprintf(&sb, " leader %q", cl.Leader)
					for _, r := range cl.Replicas {
						fmt.Fprintf(&sb, "; %s current=%v offline=%v lag=%d active=%v", r.Name, r.Current, r.Offline, r.Lag, r.Active)
					}
				}
			}
		}
		t.Logf("jsz %s: %s", s.Name, sb.String())
	}
}
