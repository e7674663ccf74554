package main

// compose.supercluster.yaml (two NATS clusters joined by gateways, the
// mesh's state in the home cluster; docs/operations.md §13), checked as
// compose_test.go checks compose.yaml: with nats-server's real config parser
// and option validation and meshd's real flag set. TestComposeSuperclusterCatches
// shows that the checks fail on broken variants of the file.

import (
	"fmt"
	"maps"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/conf"
	"github.com/nats-io/nats-server/v2/server"
)

const (
	superclusterFile = "compose.supercluster.yaml"
	// homeCluster holds the mesh's registry, directory, state and
	// reminders: the only cluster with JetStream, every node's --kv-cluster.
	homeCluster = "east"
	// superclusterReplicas is --kv-replicas and --state-replicas: the home
	// cluster's servers.
	superclusterReplicas = 3
)

func TestComposeSupercluster(t *testing.T) {
	s := loadSupercluster(t)
	s.checkSupercluster(t, t, loadReferenceAccounts(t))
}

// loadSupercluster loads compose.supercluster.yaml and its NATS configs.
func loadSupercluster(t *testing.T) *setup {
	t.Helper()
	s := loadSetupFile(t, superclusterFile)
	if errs := s.loadNATS(); len(errs) > 0 {
		for _, err := range errs {
			t.Error(err)
		}
		t.FailNow()
	}
	return s
}

// accountsConf is the account part of a NATS config file, as nats-server's
// config parser reads it (includes resolved), and the ping settings.
type accountsConf struct {
	accounts, systemAccount, noAuthUser any
	pingInterval, pingMax               any
}

func readAccountsConf(hostFile string) (accountsConf, error) {
	m, err := conf.ParseFile(hostFile)
	if err != nil {
		return accountsConf{}, err
	}
	return accountsConf{m["accounts"], m["system_account"], m["no_auth_user"], m["ping_interval"], m["ping_max"]}, nil
}

// loadReferenceAccounts is the account configuration of compose.yaml's
// first NATS server, which every supercluster server must share.
func loadReferenceAccounts(t *testing.T) accountsConf {
	t.Helper()
	ref := loadSetup(t)
	if errs := ref.loadNATS(); len(errs) > 0 || len(ref.nats) == 0 {
		t.Fatalf("compose.yaml: the NATS services do not parse (see TestComposeNATSCluster): %v", errs)
	}
	a, err := readAccountsConf(ref.natsConf[ref.nats[0].name].host)
	if err != nil {
		t.Fatal(err)
	}
	if a.accounts == nil || a.systemAccount == nil {
		t.Fatalf("compose.yaml: service %q has no accounts or system_account", ref.nats[0].name)
	}
	return a
}

// checkSupercluster runs every check of the supercluster file (loaded with
// loadNATS; the model may have been altered since), reporting to r.
func (s *setup) checkSupercluster(t *testing.T, r reporter, refAccounts accountsConf) {
	t.Helper()
	r.Helper()

	// Six servers in two clusters of three, one of them the home cluster.
	if len(s.nats) != 6 {
		r.Errorf("%s: %d NATS services (image nats:*), want 6", s.file, len(s.nats))
	}
	clusters := s.clusters()
	if len(clusters) != 2 {
		r.Errorf("%s: the NATS services form %d clusters (%v), want two", s.file, len(clusters), clusters)
	}
	for c, members := range clusters {
		if len(members) != 3 {
			r.Errorf("%s: cluster %q has %d servers (%v), want 3", s.file, c, len(members), members)
		}
	}
	if _, ok := clusters[homeCluster]; !ok {
		r.Errorf("%s: no cluster %q (the home cluster)", s.file, homeCluster)
	}

	// Routes, gateways, JetStream exactly on the home cluster with a store
	// volume each, ports, healthchecks.
	s.checkNATSServers(r, func(c string) bool { return c == homeCluster })

	// The accounts: compose.yaml's, from a file mounted where the include
	// finds it in the container too.
	for _, svc := range s.nats {
		where := fmt.Sprintf("%s: service %q", s.file, svc.name)
		cf := s.natsConf[svc.name]
		a, err := readAccountsConf(cf.host)
		if err != nil {
			r.Errorf("%s: %v", where, err)
			continue
		}
		if !reflect.DeepEqual(a, refAccounts) {
			r.Errorf("%s: accounts, system_account, no_auth_user or ping settings differ from compose.yaml's servers' (deploy/nats/accounts.conf): the mesh needs the same accounts, with the disconnect advisory, on every server", where)
		}
		s.checkIncludes(r, where, svc, cf)
	}

	// The nodes: meshd's own checks, then the supercluster's.
	nodes := s.checkMeshd(t, r)
	if len(nodes) != len(s.meshd) {
		return // reported
	}
	perCluster := map[string]int{}
	for _, n := range nodes {
		where := fmt.Sprintf("%s: service %q", s.file, n.svc.name)
		value := func(name string) string {
			f := n.flags.Lookup(name)
			if f == nil {
				t.Fatalf("meshd has no --%s flag", name)
			}
			return f.Value.String()
		}
		home := value("kv-cluster")
		switch _, ok := clusters[home]; {
		case home == "":
			r.Errorf("%s: no --kv-cluster; the first node to start would place the mesh's buckets in its own cluster", where)
		case !ok:
			r.Errorf("%s: --kv-cluster %q is not a cluster of %s (%v)", where, home, s.file, slices.Sorted(maps.Keys(clusters)))
		case home != homeCluster:
			r.Errorf("%s: --kv-cluster %q, want the home cluster %q (the one with JetStream)", where, home, homeCluster)
		}
		for _, f := range []string{"kv-replicas", "state-replicas"} {
			if v := value(f); v != strconv.Itoa(superclusterReplicas) {
				r.Errorf("%s: --%s %s, want %d (the home cluster's servers)", where, f, v, superclusterReplicas)
			}
		}
		own := s.oneCluster(r, where+": --nats-url", n.natsHosts)
		if own != "" {
			perCluster[own]++
		}
		if envOwn := s.oneCluster(r, where+": environment NATS_URL", n.envHosts); envOwn != "" && own != "" && envOwn != own {
			r.Errorf("%s: environment NATS_URL names cluster %q, --nats-url cluster %q", where, envOwn, own)
		}
		for _, h := range clusters[homeCluster] {
			if n.svc.DependsOn[h] != "service_healthy" {
				r.Errorf("%s: does not wait for %s of the home cluster (depends_on %s: {condition: service_healthy}); it creates or opens its buckets there on start", where, h, h)
			}
		}
	}
	for _, c := range slices.Sorted(maps.Keys(clusters)) {
		if perCluster[c] < 2 {
			r.Errorf("%s: %d meshd services connect to cluster %q, want at least 2", s.file, perCluster[c], c)
		}
	}

	s.checkHostPortsAndDependencies(r)
}

// oneCluster returns the cluster of the NATS services hosts, reporting a
// list that spans clusters: a node's client only learns its own cluster's
// servers, and one that could reach two would not self-fence when its
// cluster is cut off.
func (s *setup) oneCluster(r reporter, what string, hosts []string) string {
	r.Helper()
	seen := map[string][]string{}
	for _, h := range hosts {
		if o := s.natsOpts[h]; o != nil {
			seen[o.Cluster.Name] = append(seen[o.Cluster.Name], h)
		}
	}
	if len(seen) > 1 {
		r.Errorf("%s: names servers of %d clusters (%v); a node connects to its own cluster's servers only", what, len(seen), seen)
		return ""
	}
	for c := range seen {
		return c
	}
	return ""
}

var includeRE = regexp.MustCompile(`(?m)^\s*include\s+(?:"([^"]+)"|'([^']+)'|(\S+))`)

// checkIncludes checks that every include of the service's config resolves
// in the container (relative to the config's container path) to a file
// bind-mounted from the host file the parser read (relative to the host
// config).
func (s *setup) checkIncludes(r reporter, where string, svc *composeService, cf natsConfFile) {
	r.Helper()
	text, err := os.ReadFile(cf.host)
	if err != nil {
		r.Errorf("%s: %v", where, err)
		return
	}
	for _, m := range includeRE.FindAllStringSubmatch(string(text), -1) {
		inc := m[1] + m[2] + m[3]
		container := path.Join(path.Dir(cf.container), inc)
		host := filepath.Join(filepath.Dir(cf.host), filepath.FromSlash(inc))
		mounted := ""
		for _, v := range svc.Volumes {
			if v.Type == "bind" && path.Clean(v.Target) == container {
				mounted = filepath.Join(repoRoot, filepath.FromSlash(v.Source))
			}
		}
		switch {
		case mounted == "":
			r.Errorf("%s: its config includes %q, which is %s in the container; no file is bind-mounted there", where, inc, container)
		case filepath.Clean(mounted) != filepath.Clean(host):
			r.Errorf("%s: its config includes %q: the container's %s is %s, but the parser read %s", where, inc, container, mounted, host)
		}
	}
}

// findings collects a check's reports.
type findings []string

func (f *findings) Helper() {}
func (f *findings) Errorf(format string, args ...any) {
	*f = append(*f, fmt.Sprintf(format, args...))
}

// TestComposeSuperclusterCatches alters the parsed supercluster file in
// ways a hand edit could, and wants checkSupercluster to name each.
func TestComposeSuperclusterCatches(t *testing.T) {
	ref := loadReferenceAccounts(t)
	// setFlag replaces (or adds) a meshd service's --name=value.
	setFlag := func(s *setup, svc, flag, value string) {
		c := s.compose.Services[svc]
		c.Command.Args = slices.DeleteFunc(slices.Clone(c.Command.Args), func(a string) bool {
			return strings.HasPrefix(a, "--"+flag+"=")
		})
		c.Command.Args = append(c.Command.Args, "--"+flag+"="+value)
	}
	mustURL := func(u string) *url.URL {
		p, err := url.Parse(u)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	cases := []struct {
		name   string
		mutate func(t *testing.T, s *setup)
		want   string
	}{
		{"gateway URL at a client port", func(t *testing.T, s *setup) {
			for _, g := range s.natsOpts["west-2"].Gateway.Gateways {
				if g.Name == "east" {
					g.URLs[0] = mustURL("nats://east-1:4222")
				}
			}
		}, `"west-2": gateway "east" URL nats://east-1:4222: east-1's gateway port is 7222`},
		{"gateway URL naming the other cluster's server", func(t *testing.T, s *setup) {
			s.natsOpts["east-1"].Gateway.Gateways[1].URLs[0] = mustURL("nats://east-3:7222")
		}, `gateway "west" URL nats://east-3:7222: east-3 is in cluster "east"`},
		{"gateway name not the cluster name", func(t *testing.T, s *setup) {
			s.natsOpts["west-3"].Gateway.Name = "west3"
		}, `"west-3": gateway name "west3", want its cluster name "west"`},
		{"gateways missing a cluster", func(t *testing.T, s *setup) {
			o := s.natsOpts["east-2"]
			o.Gateway.Gateways = slices.DeleteFunc(o.Gateway.Gateways, func(g *server.RemoteGatewayOpts) bool { return g.Name == "west" })
		}, `"east-2": gateways do not list cluster "west"`},
		{"a route across clusters", func(t *testing.T, s *setup) {
			o := s.natsOpts["west-1"]
			o.Routes = append(o.Routes, mustURL("nats://east-1:6222"))
		}, `route nats://east-1:6222 leads to east-1 of cluster "east"`},
		{"a missing route", func(t *testing.T, s *setup) {
			s.natsOpts["east-3"].Routes = s.natsOpts["east-3"].Routes[:1]
		}, `"east-3": no route to east-2`},
		{"JetStream on west", func(t *testing.T, s *setup) {
			s.natsOpts["west-1"].JetStream = true
		}, `"west-1": JetStream enabled is true, want false in cluster "west"`},
		{"an east store on a shared volume", func(t *testing.T, s *setup) {
			s.compose.Services["east-2"].Volumes = append(slices.Clone(s.compose.Services["east-2"].Volumes[:2]), volumeMount{Type: "volume", Source: "east-1-data", Target: "/data"})
		}, `"east-2": store volume "east-1-data" is also "east-1"'s`},
		{"an unpublished monitoring port", func(t *testing.T, s *setup) {
			s.compose.Services["west-2"].Ports = s.compose.Services["west-2"].Ports[:1]
		}, `"west-2": its monitoring port 8222 is not published`},
		{"accounts without the disconnect advisory's import", func(t *testing.T, s *setup) {
			// west-1.conf beside a copy of accounts.conf that lacks MESH's
			// import of the advisory.
			dir := t.TempDir()
			cf := s.natsConf["west-1"]
			accounts := readText(t, filepath.Join(filepath.Dir(cf.host), "..", "accounts.conf"))
			imp := `    imports: [{stream: {account: SYS, subject: "$SYS.ACCOUNT.MESH.DISCONNECT"}}]` + "\n"
			if !strings.Contains(accounts, imp) {
				t.Fatalf("deploy/nats/accounts.conf has no line %q", imp)
			}
			writeText(t, filepath.Join(dir, "accounts.conf"), strings.Replace(accounts, imp, "", 1))
			if err := os.Mkdir(filepath.Join(dir, "sc"), 0o755); err != nil {
				t.Fatal(err)
			}
			cf.host = filepath.Join(dir, "sc", "west-1.conf")
			writeText(t, cf.host, readText(t, s.natsConf["west-1"].host))
			s.natsConf["west-1"] = cf
		}, `"west-1": accounts, system_account`},
		{"accounts file mounted where the include does not look", func(t *testing.T, s *setup) {
			v := s.compose.Services["east-1"].Volumes
			s.compose.Services["east-1"].Volumes = []volumeMount{v[0], {Type: "bind", Source: v[1].Source, Target: "/etc/nats/supercluster/accounts.conf"}, v[2]}
		}, `"east-1": its config includes "../accounts.conf", which is /etc/nats/accounts.conf in the container; no file is bind-mounted there`},
		{"meshd --nats-url spanning both clusters", func(t *testing.T, s *setup) {
			setFlag(s, "mesh-west-1", "nats-url", "nats://west-1:4222,nats://west-2:4222,nats://east-1:4222")
		}, `"mesh-west-1": --nats-url: names servers of 2 clusters`},
		{"meshd without --kv-cluster", func(t *testing.T, s *setup) {
			setFlag(s, "mesh-east-2", "kv-cluster", "")
		}, `"mesh-east-2": no --kv-cluster`},
		{"meshd --kv-cluster not a cluster of the file", func(t *testing.T, s *setup) {
			setFlag(s, "mesh-west-2", "kv-cluster", "north")
		}, `"mesh-west-2": --kv-cluster "north" is not a cluster`},
		{"meshd --kv-cluster west", func(t *testing.T, s *setup) {
			setFlag(s, "mesh-west-2", "kv-cluster", "west")
		}, `"mesh-west-2": --kv-cluster "west", want the home cluster "east"`},
		{"meshd --state-replicas 1", func(t *testing.T, s *setup) {
			setFlag(s, "mesh-east-1", "state-replicas", "1")
		}, `"mesh-east-1": --state-replicas 1, want 3`},
		{"meshd rejected by meshd's flags", func(t *testing.T, s *setup) {
			setFlag(s, "mesh-east-1", "kv-replicas", "three")
		}, `"mesh-east-1": meshd rejects its arguments`},
		{"one node in west", func(t *testing.T, s *setup) {
			setFlag(s, "mesh-west-2", "nats-url", "nats://east-1:4222,nats://east-2:4222,nats://east-3:4222")
		}, `1 meshd services connect to cluster "west", want at least 2`},
		{"duplicate node names", func(t *testing.T, s *setup) {
			setFlag(s, "mesh-west-2", "name", "mesh-east-1")
		}, `"mesh-west-2": --name "mesh-east-1" is also "mesh-east-1"'s`},
		{"a meshd port where meshd does not listen", func(t *testing.T, s *setup) {
			s.compose.Services["mesh-east-2"].Ports[0].Container = 7071
		}, `"mesh-east-2": ports: 127.0.0.1:7082:7070 publishes container port 7071, where meshd does not listen`},
		{"a host port published twice", func(t *testing.T, s *setup) {
			s.compose.Services["mesh-west-2"].Ports[0].Host = 7081
		}, `host port 7081/tcp is also published by "mesh-east-1"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := loadSupercluster(t)
			tc.mutate(t, s)
			var got findings
			s.checkSupercluster(t, &got, ref)
			i := slices.IndexFunc(got, func(f string) bool { return strings.Contains(f, tc.want) })
			if i < 0 {
				t.Fatalf("no finding contains %q; findings:\n  %s", tc.want, strings.Join(got, "\n  "))
			}
			t.Logf("caught (%d findings): %s", len(got), got[i])
		})
	}
}

func readText(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func writeText(t *testing.T, name, text string) {
	t.Helper()
	if err := os.WriteFile(name, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}
