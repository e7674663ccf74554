package main

// The container files (compose.yaml, deploy/nats/*.conf, Dockerfile,
// .dockerignore) are never run on CI, which has no Docker engine. These
// tests read them and check that they agree with the binaries: meshd's real
// flag set, nats-server's real config parser, the built-in hub kinds and the
// node-name rules.

import (
	"encoding/json"
	"flag"
	"fmt"
	"go/build"
	"io"
	"maps"
	"net"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"

	"github.com/natsmesh/natsmesh/hubs"
	"github.com/natsmesh/natsmesh/subjects"
)

// repoRoot is the repository root, relative to this package's directory
// (where go test runs); compose.yaml's relative paths start there.
const repoRoot = "../.."

// --- compose.yaml model: only the fields the checks need -------------------

type composeFile struct {
	Services map[string]*composeService `yaml:"services"`
	Volumes  map[string]any             `yaml:"volumes"`
}

type composeService struct {
	Image           string         `yaml:"image"`
	Build           *composeBuild  `yaml:"build"`
	Entrypoint      cmdLine        `yaml:"entrypoint"`
	Command         cmdLine        `yaml:"command"`
	Environment     envList        `yaml:"environment"`
	Ports           []portMapping  `yaml:"ports"`
	Volumes         []volumeMount  `yaml:"volumes"`
	DependsOn       dependsOn      `yaml:"depends_on"`
	Healthcheck     *composeHealth `yaml:"healthcheck"`
	StopGracePeriod string         `yaml:"stop_grace_period"`
	name            string         // the service's key
}

type composeHealth struct {
	Test    cmdLine `yaml:"test"`
	Disable bool    `yaml:"disable"`
}

// composeBuild is build: as a context string or a mapping.
type composeBuild struct {
	Context, Dockerfile string
}

func (b *composeBuild) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		b.Context = n.Value
		return nil
	}
	var m struct {
		Context    string `yaml:"context"`
		Dockerfile string `yaml:"dockerfile"`
	}
	if err := n.Decode(&m); err != nil {
		return err
	}
	b.Context, b.Dockerfile = m.Context, m.Dockerfile
	return nil
}

// cmdLine is command:, entrypoint: or healthcheck test: as a list or a
// string (split on white space; quoting is refused: use the list form).
type cmdLine struct {
	Args []string
	Set  bool
}

func (c *cmdLine) UnmarshalYAML(n *yaml.Node) error {
	c.Set = true
	if n.Kind == yaml.ScalarNode {
		if strings.ContainsAny(n.Value, `"'\`) {
			return fmt.Errorf("line %d: quoting in a string command is not checked by this test; use the list form", n.Line)
		}
		c.Args = strings.Fields(n.Value)
		return nil
	}
	return n.Decode(&c.Args)
}

// envList is environment: as a mapping or a list of K=V.
type envList map[string]string

func (e *envList) UnmarshalYAML(n *yaml.Node) error {
	*e = envList{}
	if n.Kind == yaml.SequenceNode {
		var l []string
		if err := n.Decode(&l); err != nil {
			return err
		}
		for _, kv := range l {
			k, v, _ := strings.Cut(kv, "=")
			(*e)[k] = v
		}
		return nil
	}
	var m map[string]*string
	if err := n.Decode(&m); err != nil {
		return err
	}
	for k, v := range m {
		if v != nil {
			(*e)[k] = *v
		}
	}
	return nil
}

// portMapping is one ports: entry, short ("[ip:][host:]container[/proto]")
// or long syntax.
type portMapping struct {
	Raw             string
	HostIP          string
	Host, Container int // Host 0: not published on a fixed host port
	Proto           string
}

func (p *portMapping) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.MappingNode {
		var m struct {
			Target    int    `yaml:"target"`
			Published string `yaml:"published"`
			HostIP    string `yaml:"host_ip"`
			Protocol  string `yaml:"protocol"`
		}
		if err := n.Decode(&m); err != nil {
			return err
		}
		p.Raw = fmt.Sprintf("{target: %d, published: %s}", m.Target, m.Published)
		p.Container, p.HostIP, p.Proto = m.Target, m.HostIP, m.Protocol
		if m.Published != "" {
			h, err := strconv.Atoi(m.Published)
			if err != nil {
				return fmt.Errorf("line %d: port %s: published %q: want one port number", n.Line, p.Raw, m.Published)
			}
			p.Host = h
		}
	} else {
		p.Raw = n.Value
		s, proto, _ := strings.Cut(n.Value, "/")
		p.Proto = proto
		if strings.HasPrefix(s, "[") { // [ipv6]:host:container
			i := strings.Index(s, "]:")
			if i < 0 {
				return fmt.Errorf("line %d: port %q: bad IPv6 host address", n.Line, n.Value)
			}
			p.HostIP, s = s[1:i], s[i+2:]
		}
		parts := strings.Split(s, ":")
		if len(parts) == 3 {
			p.HostIP, parts = parts[0], parts[1:]
		}
		nums := make([]int, len(parts))
		for i, x := range parts {
			v, err := strconv.Atoi(x)
			if err != nil || len(parts) > 2 {
				return fmt.Errorf("line %d: port %q: want [ip:][host:]container[/proto] with single ports (ranges are not checked by this test)", n.Line, n.Value)
			}
			nums[i] = v
		}
		p.Container = nums[len(nums)-1]
		if len(nums) == 2 {
			p.Host = nums[0]
		}
	}
	if p.Proto == "" {
		p.Proto = "tcp"
	}
	if p.Container <= 0 || p.Container > 65535 || p.Host < 0 || p.Host > 65535 {
		return fmt.Errorf("line %d: port %s: port number out of range", n.Line, p.Raw)
	}
	return nil
}

// volumeMount is one volumes: entry, short ("source:target[:mode]") or long.
type volumeMount struct {
	Type, Source, Target string // Type "bind" or "volume"
}

func (v *volumeMount) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.MappingNode {
		var m struct{ Type, Source, Target string }
		if err := n.Decode(&m); err != nil {
			return err
		}
		*v = volumeMount{Type: m.Type, Source: m.Source, Target: m.Target}
		return nil
	}
	parts := strings.Split(n.Value, ":")
	if len(parts) == 1 { // anonymous volume
		*v = volumeMount{Type: "volume", Target: parts[0]}
		return nil
	}
	v.Source, v.Target = parts[0], parts[1]
	v.Type = "volume"
	if strings.HasPrefix(v.Source, ".") || strings.HasPrefix(v.Source, "/") || strings.HasPrefix(v.Source, "~") {
		v.Type = "bind"
	}
	return nil
}

// dependsOn is depends_on: as a list or a mapping to conditions.
type dependsOn map[string]string

func (d *dependsOn) UnmarshalYAML(n *yaml.Node) error {
	*d = dependsOn{}
	if n.Kind == yaml.SequenceNode {
		var l []string
		if err := n.Decode(&l); err != nil {
			return err
		}
		for _, s := range l {
			(*d)[s] = "service_started"
		}
		return nil
	}
	var m map[string]struct {
		Condition string `yaml:"condition"`
	}
	if err := n.Decode(&m); err != nil {
		return err
	}
	for s, c := range m {
		if c.Condition == "" {
			c.Condition = "service_started"
		}
		(*d)[s] = c.Condition
	}
	return nil
}

// --- Dockerfile model -------------------------------------------------------

type dockerInstr struct {
	Line int
	Cmd  string // upper case
	Args string
}

type dockerStage struct {
	From, Name string
	Instrs     []dockerInstr
}

// parseDockerfile splits a Dockerfile into stages of instructions, joining
// backslash continuations and dropping comments.
func parseDockerfile(text string) ([]dockerStage, error) {
	var stages []dockerStage
	var cur strings.Builder
	start := 0
	flush := func() error {
		s := strings.TrimSpace(cur.String())
		cur.Reset()
		if s == "" {
			return nil
		}
		cmd, args, _ := strings.Cut(s, " ")
		in := dockerInstr{Line: start, Cmd: strings.ToUpper(cmd), Args: strings.TrimSpace(args)}
		if in.Cmd == "FROM" {
			f := strings.Fields(in.Args)
			f = slices.DeleteFunc(f, func(x string) bool { return strings.HasPrefix(x, "--") })
			st := dockerStage{}
			if len(f) > 0 {
				st.From = f[0]
			}
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				st.Name = f[2]
			}
			stages = append(stages, st)
			return nil
		}
		if len(stages) == 0 {
			return fmt.Errorf("Dockerfile:%d: %s before the first FROM", in.Line, in.Cmd)
		}
		stages[len(stages)-1].Instrs = append(stages[len(stages)-1].Instrs, in)
		return nil
	}
	for i, line := range strings.Split(text, "\n") {
		t := strings.TrimSpace(line)
		if strings.HasPrefix(t, "#") {
			continue
		}
		if cur.Len() == 0 {
			if t == "" {
				continue
			}
			start = i + 1
		}
		if c, ok := strings.CutSuffix(t, `\`); ok {
			cur.WriteString(c + " ")
			continue
		}
		cur.WriteString(t)
		if err := flush(); err != nil {
			return nil, err
		}
	}
	if err := flush(); err != nil {
		return nil, err
	}
	if len(stages) == 0 {
		return nil, fmt.Errorf("Dockerfile: no FROM")
	}
	return stages, nil
}

// envOf returns the stage's ENV settings (K=V form; the legacy "ENV K V"
// form too).
func (s dockerStage) envOf() map[string]string {
	env := map[string]string{}
	for _, in := range s.Instrs {
		if in.Cmd != "ENV" {
			continue
		}
		if !strings.Contains(strings.Fields(in.Args)[0], "=") {
			k, v, _ := strings.Cut(in.Args, " ")
			env[k] = strings.TrimSpace(v)
			continue
		}
		for _, kv := range strings.Fields(in.Args) {
			k, v, _ := strings.Cut(kv, "=")
			env[k] = strings.Trim(v, `"`)
		}
	}
	return env
}

// --- loading ----------------------------------------------------------------

// reporter takes a check's findings: a *testing.T, or a findings list in
// the tests that show a check catches a broken variant.
type reporter interface {
	Helper()
	Errorf(format string, args ...any)
}

// setup is a compose file and the Dockerfile, parsed and classified.
type setup struct {
	file          string // the compose file's name, relative to repoRoot
	compose       composeFile
	nats, meshd   []*composeService // sorted by name
	stages        []dockerStage
	entrypoint    []string // the final stage's ENTRYPOINT, exec form
	imageEnv      map[string]string
	natsOpts      map[string]*server.Options // by service name, after loadNATS
	natsConf      map[string]natsConfFile    // by service name, after loadNATS
	exposed       map[int]bool
	modulePath    string
	goVersion     string // go.mod's go directive
	builtPackages []string
}

func loadSetup(t *testing.T) *setup {
	t.Helper()
	return loadSetupFile(t, "compose.yaml")
}

// loadSetupFile is loadSetup for the compose file file (relative to the
// repository root).
func loadSetupFile(t *testing.T, file string) *setup {
	t.Helper()
	s := &setup{file: file, natsOpts: map[string]*server.Options{}, natsConf: map[string]natsConfFile{}, exposed: map[int]bool{}}
	raw, err := os.ReadFile(filepath.Join(repoRoot, file))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(raw, &s.compose); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	if len(s.compose.Services) == 0 {
		t.Fatalf("%s: no services", file)
	}

	gomod, err := os.ReadFile(filepath.Join(repoRoot, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	for l := range strings.SplitSeq(string(gomod), "\n") {
		f := strings.Fields(l)
		if len(f) == 2 && f[0] == "module" {
			s.modulePath = f[1]
		}
		if len(f) == 2 && f[0] == "go" {
			s.goVersion = f[1]
		}
	}

	df, err := os.ReadFile(filepath.Join(repoRoot, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	if s.stages, err = parseDockerfile(string(df)); err != nil {
		t.Fatal(err)
	}
	final := s.stages[len(s.stages)-1]
	s.imageEnv = final.envOf()
	for _, in := range final.Instrs {
		switch in.Cmd {
		case "ENTRYPOINT":
			s.entrypoint = nil
			if err := json.Unmarshal([]byte(in.Args), &s.entrypoint); err != nil || len(s.entrypoint) == 0 {
				t.Errorf("Dockerfile:%d: ENTRYPOINT %s: want the exec form, a JSON array naming the binary", in.Line, in.Args)
			}
		case "EXPOSE":
			for _, p := range strings.Fields(in.Args) {
				p, proto, _ := strings.Cut(p, "/")
				n, err := strconv.Atoi(p)
				if err != nil || proto != "" && proto != "tcp" {
					t.Errorf("Dockerfile:%d: EXPOSE %s: want TCP port numbers", in.Line, in.Args)
					continue
				}
				s.exposed[n] = true
			}
		}
	}
	for _, in := range allInstrs(s.stages) {
		if in.Cmd == "RUN" && strings.Contains(in.Args, "go build") {
			for _, f := range strings.Fields(in.Args) {
				if strings.HasPrefix(f, "./") {
					s.builtPackages = append(s.builtPackages, path.Clean(f))
				}
			}
		}
	}

	names := slices.Sorted(func(yield func(string) bool) {
		for n := range s.compose.Services {
			if !yield(n) {
				return
			}
		}
	})
	for _, n := range names {
		svc := s.compose.Services[n]
		svc.name = n
		switch {
		case isNATSImage(svc.Image):
			s.nats = append(s.nats, svc)
		case svc.Build != nil:
			s.meshd = append(s.meshd, svc)
		default:
			t.Errorf("%s: service %q is neither a NATS server (image nats:2.x) nor built from the Dockerfile; teach cmd/meshd/compose_test.go about it", file, n)
		}
	}
	return s
}

func allInstrs(stages []dockerStage) []dockerInstr {
	var all []dockerInstr
	for _, st := range stages {
		all = append(all, st.Instrs...)
	}
	return all
}

// isNATSImage reports whether image is the official nats image, any tag.
func isNATSImage(image string) bool {
	repo, _, _ := strings.Cut(image, ":")
	return repo == "nats" || repo == "library/nats" || repo == "docker.io/library/nats"
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}

// withContainerEnv makes the process environment hold exactly env's MESHD_*
// variables (as the container would), for newRootCmd's env defaults.
func withContainerEnv(t *testing.T, env map[string]string) {
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "MESHD_") {
			t.Setenv(k, "") // restores the old value after the test
			os.Unsetenv(k)
		}
	}
	for k, v := range env {
		if strings.HasPrefix(k, "MESHD_") {
			t.Setenv(k, v)
		}
	}
}

// --- the NATS cluster ---------------------------------------------------------

// natsOptions parses a NATS service's command with nats-server's real flag
// set, and its --config file (the bind-mounted host file) with the real
// config parser.
func natsOptions(svc *composeService) (*server.Options, natsConfFile, error) {
	args := svc.Command.Args
	if !svc.Command.Set { // the nats image's CMD
		args = []string{"--config", "/etc/nats/nats-server.conf"}
	}
	if svc.Entrypoint.Set {
		return nil, natsConfFile{}, fmt.Errorf("entrypoint: set; this test assumes the nats image's own")
	}
	if len(args) > 0 && args[0] == "nats-server" {
		args = args[1:]
	} else if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		return nil, natsConfFile{}, fmt.Errorf("command %q: the nats image runs that as a program, not nats-server; start it with nats-server or a flag", args)
	}
	// Map the container path of --config to the host file.
	var cf natsConfFile
	args = slices.Clone(args)
	for i := 0; i < len(args); i++ {
		name, val, hasVal := strings.Cut(strings.TrimLeft(args[i], "-"), "=")
		switch name {
		case "sl", "signal", "h", "help", "help_tls", "v", "version":
			return nil, natsConfFile{}, fmt.Errorf("command %q: flag -%s does not run a server", args, name)
		case "c", "config":
			vi := i
			if !hasVal {
				if vi++; vi >= len(args) {
					return nil, natsConfFile{}, fmt.Errorf("command %q: --config without a file", args)
				}
				val = args[vi]
			}
			host := ""
			cf.container = val
			for _, v := range svc.Volumes {
				if v.Type == "bind" && v.Target == val {
					host = filepath.Join(repoRoot, filepath.FromSlash(v.Source))
				}
			}
			if host == "" {
				return nil, natsConfFile{}, fmt.Errorf("--config %s is not a file bind-mounted in volumes:", val)
			}
			cf.host = host
			if hasVal {
				args[i] = "--config=" + host
			} else {
				args[vi] = host
			}
		}
	}
	fs := flag.NewFlagSet("nats-server", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	noop := func() {}
	opts, err := server.ConfigureOptions(fs, args, noop, noop, noop)
	if err != nil {
		return nil, natsConfFile{}, fmt.Errorf("nats-server rejects command %q with its config: %v", svc.Command.Args, err)
	}
	if opts == nil {
		return nil, natsConfFile{}, fmt.Errorf("command %q does not run a server", svc.Command.Args)
	}
	return opts, cf, nil
}

// natsConfFile is a NATS service's --config: the path in the container and
// the bind-mounted host file.
type natsConfFile struct{ container, host string }

// loadNATS fills s.natsOpts and s.natsConf; it reports every NATS service that does not
// parse.
func (s *setup) loadNATS() []error {
	var errs []error
	for _, svc := range s.nats {
		o, cf, err := natsOptions(svc)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: service %q: %w", s.file, svc.name, err))
			continue
		}
		s.natsOpts[svc.name] = o
		s.natsConf[svc.name] = cf
	}
	return errs
}

func clientPort(o *server.Options) int {
	if o.Port == 0 {
		return server.DEFAULT_PORT
	}
	return o.Port
}

func TestComposeNATSCluster(t *testing.T) {
	s := loadSetup(t)
	if len(s.nats) != 3 {
		t.Fatalf("compose.yaml: %d NATS services (image nats:*), want 3", len(s.nats))
	}
	if errs := s.loadNATS(); len(errs) > 0 {
		for _, err := range errs {
			t.Error(err)
		}
		t.FailNow()
	}
	if c := s.clusters(); len(c) != 1 {
		t.Errorf("compose.yaml: the NATS services form %d clusters (%v), want one", len(c), c)
	}
	s.checkNATSServers(t, func(string) bool { return true })
}

// clusters maps each NATS cluster's name to its services (sorted by name).
func (s *setup) clusters() map[string][]string {
	c := map[string][]string{}
	for _, svc := range s.nats {
		if o := s.natsOpts[svc.name]; o != nil {
			c[o.Cluster.Name] = append(c[o.Cluster.Name], svc.name)
		}
	}
	return c
}

// checkNATSServers checks every NATS service (after loadNATS): unique server
// names; within each cluster routes between every pair, none across
// clusters; with more than one cluster, gateways joining them (the gateway
// name is the cluster name, and every server lists every cluster with the
// gateway URLs of all its servers); JetStream on its own store volume on
// the servers of the clusters jetstream names, off elsewhere; published
// ports that the server listens on; the healthcheck's port.
func (s *setup) checkNATSServers(r reporter, jetstream func(cluster string) bool) {
	r.Helper()
	clusters := s.clusters()
	serverNames := map[string]string{}
	storeVolumes := map[string]string{}
	for _, svc := range s.nats {
		o := s.natsOpts[svc.name]
		where := fmt.Sprintf("%s: service %q", s.file, svc.name)
		if o == nil {
			r.Errorf("%s: not parsed", where)
			continue
		}
		if !strings.HasPrefix(strings.TrimPrefix(svc.Image[strings.Index(svc.Image, ":")+1:], "v"), "2.") {
			r.Errorf("%s: image %s: want a nats 2.x tag", where, svc.Image)
		}
		if o.ServerName == "" {
			r.Errorf("%s: no server_name; JetStream clustering needs unique names", where)
		} else if other, dup := serverNames[o.ServerName]; dup {
			r.Errorf("%s: server_name %q is also %q's", where, o.ServerName, other)
		}
		serverNames[o.ServerName] = svc.name

		// Its cluster, with routes between every pair.
		cluster := o.Cluster.Name
		if cluster == "" {
			r.Errorf("%s: no cluster name", where)
		}
		if o.Cluster.Port == 0 {
			r.Errorf("%s: no cluster listen port", where)
		}
		if isLoopback(o.Cluster.Host) || isLoopback(o.Host) || isLoopback(o.Gateway.Host) {
			r.Errorf("%s: listens on loopback (client %q, cluster %q, gateway %q); other containers cannot reach it", where, o.Host, o.Cluster.Host, o.Gateway.Host)
		}
		routes := map[string]bool{}
		for _, rt := range o.Routes {
			other, ok := s.natsOpts[rt.Hostname()]
			switch {
			case !ok:
				r.Errorf("%s: route %s: %q is not a NATS service in %s", where, rt, rt.Hostname(), s.file)
			case rt.Hostname() == svc.name:
				r.Errorf("%s: route %s points at itself", where, rt)
			case other.Cluster.Name != cluster:
				r.Errorf("%s: route %s leads to %s of cluster %q, not its own %q; clusters are joined by gateways, not routes", where, rt, rt.Hostname(), other.Cluster.Name, cluster)
			case rt.Port() != strconv.Itoa(other.Cluster.Port):
				r.Errorf("%s: route %s: %s's cluster port is %d", where, rt, rt.Hostname(), other.Cluster.Port)
			default:
				routes[rt.Hostname()] = true
			}
		}
		for _, other := range clusters[cluster] {
			if other != svc.name && !routes[other] {
				r.Errorf("%s: no route to %s (want nats://%s:%d in cluster.routes)", where, other, other, s.natsOpts[other].Cluster.Port)
			}
		}

		// Gateways: the clusters joined into one supercluster.
		if len(clusters) > 1 {
			s.checkGateways(r, where, svc.name, clusters)
		}

		// JetStream on its own store where its cluster has it, off elsewhere.
		if wantJS := jetstream(cluster); o.JetStream != wantJS {
			r.Errorf("%s: JetStream enabled is %v, want %v in cluster %q", where, o.JetStream, wantJS, cluster)
		}
		if o.JetStream {
			if o.StoreDir == "" {
				r.Errorf("%s: no jetstream store_dir; it would default to a temporary directory", where)
			} else {
				vol := ""
				for _, v := range svc.Volumes {
					if v.Type == "volume" && (o.StoreDir == v.Target || strings.HasPrefix(o.StoreDir, strings.TrimSuffix(v.Target, "/")+"/")) {
						vol = v.Source
					}
				}
				switch other, dup := storeVolumes[vol]; {
				case vol == "":
					r.Errorf("%s: store_dir %s is not on a named volume; the store would be lost with the container", where, o.StoreDir)
				case dup:
					r.Errorf("%s: store volume %q is also %q's; each server needs its own", where, vol, other)
				}
				storeVolumes[vol] = svc.name
			}
		}

		// Published ports are ports the server listens on; client and
		// monitoring ports are published.
		listens := map[int]string{clientPort(o): "client", o.Cluster.Port: "cluster"}
		if o.Gateway.Port > 0 {
			listens[o.Gateway.Port] = "gateway"
		}
		if o.HTTPPort > 0 {
			listens[o.HTTPPort] = "monitoring"
		} else {
			r.Errorf("%s: no monitoring port (http: in its config)", where)
		}
		published := map[int]bool{}
		for _, p := range svc.Ports {
			published[p.Container] = true
			if _, ok := listens[p.Container]; !ok {
				r.Errorf("%s: ports: %s publishes container port %d, where the server does not listen (client %d, monitoring %d, cluster %d, gateway %d)", where, p.Raw, p.Container, clientPort(o), o.HTTPPort, o.Cluster.Port, o.Gateway.Port)
			}
		}
		for _, want := range []int{clientPort(o), o.HTTPPort} {
			if want > 0 && !published[want] {
				r.Errorf("%s: its %s port %d is not published in ports:", where, listens[want], want)
			}
		}
		if hc := svc.Healthcheck; hc != nil && !hc.Disable {
			for _, a := range hc.Test.Args {
				if u, err := url.Parse(a); err == nil && u.Scheme == "http" && u.Port() != strconv.Itoa(o.HTTPPort) {
					r.Errorf("%s: healthcheck probes %s, but the monitoring port is %d", where, a, o.HTTPPort)
				}
			}
		}
	}
}

// checkGateways checks the gateway block of the NATS service name in a
// file of several clusters.
func (s *setup) checkGateways(r reporter, where, name string, clusters map[string][]string) {
	r.Helper()
	o := s.natsOpts[name]
	gw := o.Gateway
	if gw.Name != o.Cluster.Name {
		r.Errorf("%s: gateway name %q, want its cluster name %q (a supercluster names each cluster once)", where, gw.Name, o.Cluster.Name)
	}
	if gw.Port == 0 {
		r.Errorf("%s: no gateway listen port; the clusters are not joined", where)
	}
	listed := map[string]bool{}
	for _, g := range gw.Gateways {
		members, ok := clusters[g.Name]
		if !ok {
			r.Errorf("%s: gateways entry %q: no cluster of that name in %s (clusters %v)", where, g.Name, s.file, slices.Sorted(maps.Keys(clusters)))
			continue
		}
		if listed[g.Name] {
			r.Errorf("%s: gateways list %q twice", where, g.Name)
		}
		listed[g.Name] = true
		named := map[string]bool{}
		for _, u := range g.URLs {
			other, ok := s.natsOpts[u.Hostname()]
			switch {
			case !ok:
				r.Errorf("%s: gateway %q URL %s: %q is not a NATS service in %s", where, g.Name, u, u.Hostname(), s.file)
			case other.Cluster.Name != g.Name:
				r.Errorf("%s: gateway %q URL %s: %s is in cluster %q", where, g.Name, u, u.Hostname(), other.Cluster.Name)
			case other.Gateway.Port == 0 || u.Port() != strconv.Itoa(other.Gateway.Port):
				r.Errorf("%s: gateway %q URL %s: %s's gateway port is %d", where, g.Name, u, u.Hostname(), other.Gateway.Port)
			default:
				named[u.Hostname()] = true
			}
		}
		for _, m := range members {
			if !named[m] {
				r.Errorf("%s: gateway %q does not list %s (want nats://%s:%d)", where, g.Name, m, m, s.natsOpts[m].Gateway.Port)
			}
		}
	}
	for _, c := range slices.Sorted(maps.Keys(clusters)) {
		if !listed[c] {
			r.Errorf("%s: gateways do not list cluster %q", where, c)
		}
	}
	// The server's own validation of the options (gateways included).
	if srv, err := server.NewServer(o.Clone()); err != nil {
		r.Errorf("%s: nats-server rejects its options: %v", where, err)
	} else {
		srv.Shutdown()
	}
}

// --- the meshd nodes ----------------------------------------------------------

func TestComposeMeshd(t *testing.T) {
	s := loadSetup(t)
	if errs := s.loadNATS(); len(errs) > 0 || len(s.nats) == 0 {
		t.Fatalf("compose.yaml: the NATS services do not parse (see TestComposeNATSCluster): %v", errs)
	}
	if len(s.meshd) < 3 {
		t.Errorf("compose.yaml: %d meshd services (built from the Dockerfile), want at least 3", len(s.meshd))
	}
	s.checkMeshd(t, t)
}

// meshdNode is a meshd service whose command meshd's flag set parsed.
type meshdNode struct {
	svc   *composeService
	flags *pflag.FlagSet
	// natsHosts are the NATS services of --nats-url; envHosts those of the
	// environment's NATS_URL (meshctl in the container).
	natsHosts, envHosts []string
}

// checkMeshd checks every meshd service (after loadNATS) with meshd's real
// flag set, reporting to r (t is for the environment and for a flag meshd
// lacks): the program, --name (valid, unique), --nats-url and NATS_URL
// (NATS services' client ports, waited for), --hubs (built-in kinds),
// --http (published, exposed), --drain-timeout within the stop grace
// period. It returns the nodes that parsed.
func (s *setup) checkMeshd(t *testing.T, r reporter) []meshdNode {
	t.Helper()
	r.Helper()
	var nodes []meshdNode
	kinds := hubs.Names()
	nodeNames := map[string]string{}
	for _, svc := range s.meshd {
		where := fmt.Sprintf("%s: service %q", s.file, svc.name)
		if ctx := filepath.Join(repoRoot, svc.Build.Context); filepath.Clean(ctx) != filepath.Clean(repoRoot) {
			r.Errorf("%s: build context %q, want the repository root \".\"", where, svc.Build.Context)
		}
		if svc.Build.Dockerfile != "" && svc.Build.Dockerfile != "Dockerfile" {
			r.Errorf("%s: build dockerfile %q; this test checks ./Dockerfile", where, svc.Build.Dockerfile)
		}

		// The container runs ENTRYPOINT + command; the program must be meshd.
		argv := append(slices.Clone(s.entrypoint), svc.Command.Args...)
		if svc.Entrypoint.Set {
			argv = append(slices.Clone(svc.Entrypoint.Args), svc.Command.Args...)
		}
		if len(argv) == 0 || path.Base(argv[0]) != "meshd" {
			r.Errorf("%s: runs %q, want meshd (the Dockerfile's ENTRYPOINT) followed by its flags", where, argv)
			continue
		}
		args := argv[1:]

		// Parse with meshd's real flag set, under the container's env.
		env := map[string]string{}
		for k, v := range s.imageEnv {
			env[k] = v
		}
		for k, v := range svc.Environment {
			env[k] = v
		}
		withContainerEnv(t, env)
		cmd := newRootCmd(io.Discard, io.Discard, nil)
		if err := cmd.ParseFlags(args); err != nil {
			r.Errorf("%s: meshd rejects its arguments %q: %v", where, args, err)
			continue
		}
		node := meshdNode{svc: svc, flags: cmd.Flags()}
		if err := cmd.ValidateArgs(cmd.Flags().Args()); err != nil {
			r.Errorf("%s: meshd rejects arguments %q: %v (command: holds meshd's flags only; the image's ENTRYPOINT is meshd)", where, cmd.Flags().Args(), err)
		}
		get := func(name string) string {
			v, err := cmd.Flags().GetString(name)
			if err != nil {
				t.Fatalf("meshd has no --%s flag: %v", name, err)
			}
			return v
		}

		// --name: valid and distinct.
		name := get("name")
		if !cmd.Flags().Changed("name") && env["MESHD_NAME"] == "" {
			r.Errorf("%s: no --name; the node would be named after the container's random host name", where)
		} else if err := subjects.ValidateNodeName(name); err != nil {
			r.Errorf("%s: --name %q: %v", where, name, err)
		} else if other, dup := nodeNames[name]; dup {
			r.Errorf("%s: --name %q is also %q's", where, name, other)
		}
		nodeNames[name] = svc.name

		// --nats-url (and NATS_URL, for meshctl in the container): the
		// compose NATS services' client ports.
		natsURL := get("nats-url")
		if natsURL == "" {
			r.Errorf("%s: no --nats-url; meshd would run its own embedded server instead of joining the cluster", where)
		}
		waitsForNATS := false
		node.natsHosts = s.checkNATSURLs(r, where+": --nats-url", natsURL)
		for _, host := range node.natsHosts {
			if _, ok := svc.DependsOn[host]; ok {
				waitsForNATS = true
			}
		}
		if natsURL != "" && !waitsForNATS {
			r.Errorf("%s: depends_on: names none of the --nats-url servers; meshd does not retry its first connection", where)
		}
		if u, ok := svc.Environment["NATS_URL"]; ok {
			node.envHosts = s.checkNATSURLs(r, where+": environment NATS_URL", u)
		}

		// --hubs: built-in kinds.
		var got []string
		for k := range strings.SplitSeq(get("hubs"), ",") {
			if k = strings.TrimSpace(k); k == "" {
				continue
			}
			got = append(got, k)
			if !slices.Contains(kinds, k) {
				r.Errorf("%s: --hubs kind %q is not built in (built-in: %s)", where, k, strings.Join(kinds, ", "))
			}
		}
		if len(got) == 0 {
			r.Errorf("%s: --hubs names no kind", where)
		}

		// --http: reachable from outside the container, published, exposed.
		httpAddr := get("http")
		host, portStr, err := net.SplitHostPort(httpAddr)
		port, perr := strconv.Atoi(portStr)
		switch {
		case httpAddr == "":
			r.Errorf("%s: --http is empty; /metrics, /healthz and /readyz would be off", where)
		case err != nil || perr != nil || port == 0:
			r.Errorf("%s: --http %q: want host:port with a fixed port", where, httpAddr)
		case isLoopback(host):
			r.Errorf("%s: --http %q listens on the container's loopback; publishing it reaches nothing (use 0.0.0.0:%d)", where, httpAddr, port)
		default:
			published := false
			for _, p := range svc.Ports {
				if p.Container == port {
					published = true
				} else {
					r.Errorf("%s: ports: %s publishes container port %d, where meshd does not listen (--http %s)", where, p.Raw, p.Container, httpAddr)
				}
			}
			if !published {
				r.Errorf("%s: --http %s: container port %d is not published in ports:", where, httpAddr, port)
			}
			if !s.exposed[port] {
				r.Errorf("%s: --http %s: port %d is not in the Dockerfile's EXPOSE (%v)", where, httpAddr, port, slices.Sorted(func(y func(int) bool) {
					for p := range s.exposed {
						if !y(p) {
							return
						}
					}
				}))
			}
		}

		// The drain must fit in the stop grace period before SIGKILL.
		drain, err := cmd.Flags().GetDuration("drain-timeout")
		if err != nil {
			t.Fatalf("meshd has no --drain-timeout flag: %v", err)
		}
		grace := 10 * time.Second // compose's default
		if svc.StopGracePeriod != "" {
			if grace, err = time.ParseDuration(svc.StopGracePeriod); err != nil {
				r.Errorf("%s: stop_grace_period %q: %v", where, svc.StopGracePeriod, err)
			}
		}
		if drain >= grace {
			r.Errorf("%s: --drain-timeout %v is not below stop_grace_period %v; docker would SIGKILL meshd mid-drain", where, drain, grace)
		}
		nodes = append(nodes, node)
	}
	return nodes
}

// checkNATSURLs checks that every URL in the comma-separated list names a
// NATS service of the compose file and its client port; it returns the
// hosts.
func (s *setup) checkNATSURLs(r reporter, what, list string) []string {
	r.Helper()
	var hosts []string
	for u := range strings.SplitSeq(list, ",") {
		u = strings.TrimSpace(u)
		if u == "" {
			continue
		}
		pu, err := url.Parse(u)
		if err != nil || pu.Hostname() == "" {
			r.Errorf("%s entry %q: want nats://host:port", what, u)
			continue
		}
		if pu.Scheme != "nats" && pu.Scheme != "tls" {
			r.Errorf("%s entry %q: scheme %q, want nats", what, u, pu.Scheme)
		}
		o, ok := s.natsOpts[pu.Hostname()]
		if !ok {
			r.Errorf("%s entry %q: %q is not a NATS service in %s", what, u, pu.Hostname(), s.file)
			continue
		}
		port := pu.Port()
		if port == "" {
			port = strconv.Itoa(server.DEFAULT_PORT)
		}
		if port != strconv.Itoa(clientPort(o)) {
			r.Errorf("%s entry %q: %s's client port is %d", what, u, pu.Hostname(), clientPort(o))
		}
		hosts = append(hosts, pu.Hostname())
	}
	return hosts
}

// --- the whole file -----------------------------------------------------------

func TestComposeHostPortsAndDependencies(t *testing.T) {
	loadSetup(t).checkHostPortsAndDependencies(t)
}

// checkHostPortsAndDependencies checks the whole compose file: host ports
// published once, depends_on naming services (with healthchecks where it
// waits for health), bind sources that exist, named volumes declared.
func (s *setup) checkHostPortsAndDependencies(r reporter) {
	r.Helper()
	type hostPort struct {
		port  int
		proto string
	}
	owner := map[hostPort]string{}
	for _, name := range slices.Sorted(func(y func(string) bool) {
		for n := range s.compose.Services {
			if !y(n) {
				return
			}
		}
	}) {
		svc := s.compose.Services[name]
		where := fmt.Sprintf("%s: service %q", s.file, name)
		for _, p := range svc.Ports {
			if p.Host == 0 {
				continue
			}
			hp := hostPort{p.Host, p.Proto}
			if other, dup := owner[hp]; dup {
				r.Errorf("%s: ports: %s: host port %d/%s is also published by %s", where, p.Raw, p.Host, p.Proto, other)
			}
			owner[hp] = fmt.Sprintf("%q (%s)", name, p.Raw)
		}
		for _, dep := range slices.Sorted(maps.Keys(svc.DependsOn)) {
			cond := svc.DependsOn[dep]
			target, ok := s.compose.Services[dep]
			switch {
			case !ok:
				r.Errorf("%s: depends_on %q: no such service", where, dep)
			case cond == "service_healthy" && (target.Healthcheck == nil || target.Healthcheck.Disable || len(target.Healthcheck.Test.Args) == 0):
				r.Errorf("%s: depends_on %q with condition service_healthy, but %q has no healthcheck", where, dep, dep)
			case cond != "service_started" && cond != "service_healthy" && cond != "service_completed_successfully":
				r.Errorf("%s: depends_on %q: unknown condition %q", where, dep, cond)
			}
		}
		for _, v := range svc.Volumes {
			switch v.Type {
			case "bind":
				if _, err := os.Stat(filepath.Join(repoRoot, filepath.FromSlash(v.Source))); err != nil {
					r.Errorf("%s: volumes: bind source %s: %v", where, v.Source, err)
				}
			case "volume":
				if _, ok := s.compose.Volumes[v.Source]; v.Source != "" && !ok {
					r.Errorf("%s: volumes: named volume %q is not declared under the top-level volumes:", where, v.Source)
				}
			}
		}
	}
}

// --- the Dockerfile -----------------------------------------------------------

func TestComposeDockerfile(t *testing.T) {
	s := loadSetup(t)

	// The build stage's Go is at least go.mod's.
	want := regexp.MustCompile(`^(\d+)\.(\d+)`).FindStringSubmatch(s.goVersion)
	foundGo := false
	for _, st := range s.stages {
		if m := regexp.MustCompile(`^(?:docker\.io/library/)?golang:(\d+)\.(\d+)`).FindStringSubmatch(st.From); m != nil {
			foundGo = true
			if want != nil && cmpVersion(m[1:], want[1:]) < 0 {
				t.Errorf("Dockerfile: FROM %s is older than go.mod's go %s", st.From, s.goVersion)
			}
		}
	}
	if !foundGo {
		t.Errorf("Dockerfile: no golang:<version> build stage")
	}

	// go build, static, of both commands.
	builds := 0
	for _, in := range allInstrs(s.stages) {
		if in.Cmd != "RUN" || !strings.Contains(in.Args, "go build") {
			continue
		}
		builds++
		for _, w := range []string{"CGO_ENABLED=0", "-trimpath"} {
			if !strings.Contains(in.Args, w) {
				t.Errorf("Dockerfile:%d: go build without %s", in.Line, w)
			}
		}
	}
	if builds == 0 {
		t.Fatalf("Dockerfile: no RUN go build")
	}
	for _, pkg := range []string{"cmd/meshd", "cmd/meshctl"} {
		if !slices.Contains(s.builtPackages, pkg) {
			t.Errorf("Dockerfile: go build does not build ./%s (it builds %v)", pkg, s.builtPackages)
		}
	}
	var pkgDirs []string
	for _, pkg := range s.builtPackages {
		p, err := build.ImportDir(filepath.Join(repoRoot, filepath.FromSlash(pkg)), 0)
		if err != nil || p.Name != "main" {
			t.Errorf("Dockerfile: go build ./%s: not a main package here (%v)", pkg, err)
			continue
		}
		pkgDirs = append(pkgDirs, pkg)
	}

	// The entrypoint is meshd, copied into the final stage at that path.
	if len(s.entrypoint) == 0 {
		t.Fatalf("Dockerfile: the final stage has no exec-form ENTRYPOINT")
	}
	ep := s.entrypoint[0]
	if path.Base(ep) != "meshd" {
		t.Errorf("Dockerfile: ENTRYPOINT runs %s, want meshd", ep)
	}
	copied := false
	for _, in := range s.stages[len(s.stages)-1].Instrs {
		if in.Cmd != "COPY" || !strings.Contains(in.Args, "--from=") {
			continue
		}
		f := slices.DeleteFunc(strings.Fields(in.Args), func(x string) bool { return strings.HasPrefix(x, "--") })
		if len(f) < 2 {
			continue
		}
		dst := f[len(f)-1]
		for _, src := range f[:len(f)-1] {
			if dst == ep || strings.HasSuffix(dst, "/") && path.Join(dst, path.Base(src)) == ep {
				copied = true
			}
		}
	}
	if !copied {
		t.Errorf("Dockerfile: no COPY --from=... in the final stage puts a binary at the ENTRYPOINT %s", ep)
	}
	if len(s.exposed) == 0 {
		t.Errorf("Dockerfile: no EXPOSE (meshd's --http port)")
	}

	// .dockerignore keeps what the build needs.
	checkDockerignore(t, s.modulePath, pkgDirs)
}

func cmpVersion(a, b []string) int {
	for i := range a {
		x, _ := strconv.Atoi(a[i])
		y, _ := strconv.Atoi(b[i])
		if x != y {
			return x - y
		}
	}
	return 0
}

// checkDockerignore checks that .dockerignore excludes neither go.mod, go.sum
// nor a Go file of the built commands or the module packages they import.
func checkDockerignore(t *testing.T, modulePath string, cmds []string) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(repoRoot, ".dockerignore"))
	if os.IsNotExist(err) {
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	type rule struct {
		re  *regexp.Regexp
		neg bool
		src string
	}
	var rules []rule
	for l := range strings.SplitSeq(string(raw), "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		neg := strings.HasPrefix(l, "!")
		p := path.Clean(strings.TrimPrefix(strings.TrimPrefix(l, "!"), "/"))
		var re strings.Builder
		re.WriteString("^")
		for i := 0; i < len(p); i++ {
			switch {
			case strings.HasPrefix(p[i:], "**/"):
				re.WriteString("(?:.*/)?")
				i += 2
			case strings.HasPrefix(p[i:], "**"):
				re.WriteString(".*")
				i++
			case p[i] == '*':
				re.WriteString("[^/]*")
			case p[i] == '?':
				re.WriteString("[^/]")
			default:
				re.WriteString(regexp.QuoteMeta(p[i : i+1]))
			}
		}
		re.WriteString("(?:/.*)?$") // a matched directory excludes its contents
		rules = append(rules, rule{regexp.MustCompile(re.String()), neg, l})
	}
	excludedBy := func(file string) string {
		by := ""
		for _, r := range rules {
			if r.re.MatchString(file) {
				by = r.src
				if r.neg {
					by = ""
				}
			}
		}
		return by
	}
	files := []string{"go.mod", "go.sum"}
	seen := map[string]bool{}
	var visit func(dir string)
	visit = func(dir string) {
		if seen[dir] {
			return
		}
		seen[dir] = true
		p, err := build.ImportDir(filepath.Join(repoRoot, filepath.FromSlash(dir)), 0)
		if err != nil {
			return
		}
		for _, f := range p.GoFiles {
			files = append(files, path.Join(dir, f))
		}
		for _, imp := range p.Imports {
			if rest, ok := strings.CutPrefix(imp, modulePath+"/"); ok {
				visit(rest)
			}
		}
	}
	for _, c := range cmds {
		visit(c)
	}
	for _, f := range files {
		if by := excludedBy(f); by != "" {
			t.Errorf(".dockerignore: %q excludes %s, which the image build needs", by, f)
		}
	}
}
