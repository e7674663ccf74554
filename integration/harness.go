// Package integration holds multi-process tests and their harness: it builds
// meshd, meshctl and nats-server (from the module versions in go.mod), runs
// them as real OS processes, and talks to them over real NATS.
package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/mesh"
)

// Binaries are the paths of the built programs.
type Binaries struct {
	Meshd, Meshctl, NATSServer, TestNode string
}

var (
	buildOnce sync.Once
	built     Binaries
	buildErr  error
)

// Build compiles meshd, meshctl and nats-server once per test binary into a
// temporary directory (removed when the process exits is left to the OS temp
// cleaner; the directory is small).
func Build(t testing.TB) Binaries {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "natsmesh-bin-")
		if err != nil {
			buildErr = err
			return
		}
		root, err := moduleRoot()
		if err != nil {
			buildErr = err
			return
		}
		built = Binaries{
			Meshd:      filepath.Join(dir, "meshd"),
			Meshctl:    filepath.Join(dir, "meshctl"),
			NATSServer: filepath.Join(dir, "nats-server"),
			TestNode:   filepath.Join(dir, "testnode"),
		}
		// One go build for the four (each named after its package's last
		// element, nats-server without its /v2): one action graph, so the
		// compiles and links of all four share the cores — four builds in
		// turn took a minute and a half of a cold run.
		pkgs := []string{"./cmd/meshd", "./cmd/meshctl", "github.com/nats-io/nats-server/v2", "./integration/testnode"}
		cmd := exec.Command("go", append(append(goBuild(), "-o", dir+string(filepath.Separator)), pkgs...)...)
		cmd.Dir = root
		if b, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build %v: %v\n%s", pkgs, err, b)
			return
		}
		for _, bin := range []string{built.Meshd, built.Meshctl, built.NATSServer, built.TestNode} {
			if _, err := os.Stat(bin); err != nil {
				buildErr = fmt.Errorf("go build %v: %w", pkgs, err)
				return
			}
		}
	})
	if buildErr != nil {
		t.Fatalf("integration: %v", buildErr)
	}
	return built
}

// goBuild is the go build command line of the harness's programs. In the
// quick suite (the README's go test -race ./..., not NATSMESH_LONG=1) it
// carries -race when this test binary does: every package the programs
// need — the standard library, nats-server, the mesh — is then compiled
// already, by the test build itself, and only the links remain. Built
// without it, a cold run compiled all of them a second time: about 200 s
// of CPU, a minute and a half of a cold run on 2 cores. The programs run
// about twice as slow under the detector (the quick suite's integration
// tests took 100 s built plain, 188 s so) and the quick suite keeps the
// short shapes; the long suite (CI's long step) builds them plain, as
// they are shipped.
//
// The quick suite's builds also leave out the DWARF debugging information
// (-ldflags=-w), as go test does for its test binaries: nothing the tests
// do reads it (stack dumps, race reports and --version use the binary's
// own tables), and the four links took 40 % longer with it (6.5 s of CPU
// instead of 4 s, warm).
func goBuild() []string {
	if raceBuild && !natstest.Long() {
		return []string{"build", "-race", "-ldflags=-w"}
	}
	return []string{"build"}
}

var (
	plantedOnce sync.Once
	plantedBin  string
	plantedErr  error
)

// BuildPlantedTestNode compiles the testnode with the build tag
// natsmesh_plant (package internal/plant: bugs switched on by
// NATSMESH_PLANT in its environment) once per test binary, and returns its
// path.
func BuildPlantedTestNode(t testing.TB) string {
	t.Helper()
	plantedOnce.Do(func() {
		dir, err := os.MkdirTemp("", "natsmesh-planted-")
		if err != nil {
			plantedErr = err
			return
		}
		root, err := moduleRoot()
		if err != nil {
			plantedErr = err
			return
		}
		plantedBin = filepath.Join(dir, "testnode")
		cmd := exec.Command("go", append(goBuild(), "-tags", "natsmesh_plant", "-o", plantedBin, "./integration/testnode")...)
		cmd.Dir = root
		if b, err := cmd.CombinedOutput(); err != nil {
			plantedErr = fmt.Errorf("go build -tags natsmesh_plant ./integration/testnode: %v\n%s", err, b)
		}
	})
	if plantedErr != nil {
		t.Fatalf("integration: %v", plantedErr)
	}
	return plantedBin
}

func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", err
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", fmt.Errorf("not inside the natsmesh module")
	}
	return filepath.Dir(mod), nil
}

// Process is a running program whose output is captured.
type Process struct {
	Cmd    *exec.Cmd
	mu     sync.Mutex
	stdout bytes.Buffer
	stderr bytes.Buffer
	lines  chan string // stdout and stderr lines, for WaitLine
	done   chan struct{}
	err    error
}

// Start runs bin with args; the process is killed when the test ends if it
// is still running.
func Start(t testing.TB, bin string, args ...string) *Process {
	t.Helper()
	return StartEnv(t, nil, bin, args...)
}

// StartEnv is Start with env ("KEY=value") added to the process's
// environment.
func StartEnv(t testing.TB, env []string, bin string, args ...string) *Process {
	t.Helper()
	p := &Process{Cmd: exec.Command(bin, args...), lines: make(chan string, 4096), done: make(chan struct{})}
	p.Cmd.Env = append(append(os.Environ(), "GOTRACEBACK=all"), env...) // GOTRACEBACK: a SIGQUIT dumps every goroutine
	outR, err := p.Cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	errR, err := p.Cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	var wg sync.WaitGroup
	pump := func(r interface{ Read([]byte) (int, error) }, buf *bytes.Buffer) {
		defer wg.Done()
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 64*1024), 1024*1024)
		for sc.Scan() {
			p.mu.Lock()
			buf.WriteString(sc.Text() + "\n")
			p.mu.Unlock()
			select {
			case p.lines <- sc.Text():
			default:
			}
		}
	}
	wg.Add(2)
	go pump(outR, &p.stdout)
	go pump(errR, &p.stderr)
	go func() {
		wg.Wait()
		p.err = p.Cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.Cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// keepProcessLog writes what p printed (stderr, then stdout if any) to
// path when the test ends (a process still running then: what it printed
// so far; Start's cleanup kills it after this one). It writes nothing if
// path's directory is gone by then.
func keepProcessLog(t testing.TB, p *Process, path string) {
	t.Cleanup(func() {
		out := p.Stderr()
		if o := p.Stdout(); o != "" {
			out += "\n--- stdout ---\n" + o
		}
		if err := os.WriteFile(path, []byte(out), 0o644); err != nil && !errors.Is(err, fs.ErrNotExist) {
			t.Logf("log of %s not kept: %v", filepath.Base(path), err)
		}
	})
}

// WaitLine waits for an output line matching re and returns its submatches.
func (p *Process) WaitLine(t testing.TB, re *regexp.Regexp, timeout time.Duration) []string {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case l := <-p.lines:
			if m := re.FindStringSubmatch(l); m != nil {
				return m
			}
		case <-p.done:
			t.Fatalf("process exited (%v) before printing %v\nstdout:\n%s\nstderr:\n%s", p.err, re, p.Stdout(), p.Stderr())
		case <-deadline:
			// Ask a Go program where it is stuck: SIGQUIT makes it print
			// every goroutine's stack (GOTRACEBACK=all, set by Start) and exit.
			_ = p.Signal(syscall.SIGQUIT)
			select {
			case <-p.done:
			case <-time.After(5 * time.Second):
			}
			t.Fatalf("no line matching %v in %v (sent SIGQUIT for a stack dump)\nstdout:\n%s\nstderr:\n%s", re, timeout, p.Stdout(), p.Stderr())
		}
	}
}

// WaitPrinted waits until the process has printed a line matching re, on
// either pipe, at any time since it started. WaitLine takes the lines in
// turn and drops those that do not match, so a line printed while another
// WaitLine was looking for its own (say, a log line on stderr overtaking
// the serving line on stdout that StartMeshd waits for) is gone from it.
func (p *Process) WaitPrinted(t testing.TB, re *regexp.Regexp, timeout time.Duration) {
	t.Helper()
	printed := func() bool {
		for _, out := range []string{p.Stderr(), p.Stdout()} {
			for _, l := range strings.Split(out, "\n") {
				if re.MatchString(l) {
					return true
				}
			}
		}
		return false
	}
	deadline := time.Now().Add(timeout)
	for !printed() {
		select {
		case <-p.done:
			if printed() {
				return
			}
			t.Fatalf("process exited (%v) without printing %v\nstdout:\n%s\nstderr:\n%s", p.err, re, p.Stdout(), p.Stderr())
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("no line matching %v in %v\nstdout:\n%s\nstderr:\n%s", re, timeout, p.Stdout(), p.Stderr())
		}
	}
}

// Signal sends sig to the process.
func (p *Process) Signal(sig syscall.Signal) error { return p.Cmd.Process.Signal(sig) }

// Wait waits for the process to exit and returns its exit code.
func (p *Process) Wait(t testing.TB, timeout time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		t.Fatalf("process did not exit in %v\nstderr:\n%s", timeout, p.Stderr())
	}
	if p.Cmd.ProcessState == nil {
		return -1
	}
	return p.Cmd.ProcessState.ExitCode()
}

// Stdout returns what the process printed on stdout so far.
func (p *Process) Stdout() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stdout.String()
}

// Stderr returns what the process printed on stderr so far.
func (p *Process) Stderr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stderr.String()
}

// Run runs bin with args to completion (bounded by timeout) and returns its
// stdout, stderr and exit code.
func Run(t testing.TB, timeout time.Duration, env []string, bin string, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("%s %v: timed out after %v\nstderr: %s", filepath.Base(bin), args, timeout, errb.String())
	}
	code := 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatalf("%s %v: %v", filepath.Base(bin), args, err)
		}
		code = ee.ExitCode()
	}
	return out.String(), errb.String(), code
}

// FreePort returns a loopback TCP port that was free a moment ago and that
// this process has not handed out before.
func FreePort(t testing.TB) int {
	t.Helper()
	for {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		portsMu.Lock()
		used := portsHanded[port]
		portsHanded[port] = true
		portsMu.Unlock()
		if !used {
			return port
		}
	}
}

var (
	portsMu     sync.Mutex
	portsHanded = map[int]bool{}
)

// NATSServer is a nats-server process.
type NATSServer struct {
	*Process
	URL string
}

// StartNATSServer runs the nats-server built from go.mod on a free loopback
// port with JetStream in a temporary directory, plus extra args, and waits
// until it accepts connections.
func StartNATSServer(t testing.TB, extra ...string) *NATSServer {
	t.Helper()
	b := Build(t)
	port := FreePort(t)
	args := append([]string{"-a", "127.0.0.1", "-p", fmt.Sprint(port), "-js", "-sd", t.TempDir()}, extra...)
	p := Start(t, b.NATSServer, args...)
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	WaitTCP(t, fmt.Sprintf("127.0.0.1:%d", port), 15*time.Second)
	return &NATSServer{Process: p, URL: url}
}

// WaitTCP polls until addr accepts a TCP connection.
func WaitTCP(t testing.TB, addr string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not accepting connections after %v: %v", addr, timeout, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Meshd is a meshd process that reported it serves.
type Meshd struct {
	*Process
	NATSURL  string // the NATS URL it uses
	Node     string // "name.gen"
	HTTPAddr string
}

var (
	servingRe = regexp.MustCompile(`^meshd: node (\S+) serving on (?:embedded )?NATS at (\S+)$`)
	httpRe    = regexp.MustCompile(`"msg":"meshd node serving".*"http":"([^"]*)"`)
)

// StartMeshd runs meshd with args (logs as JSON) and waits until it serves.
func StartMeshd(t testing.TB, args ...string) *Meshd {
	t.Helper()
	return startNode(t, Build(t).Meshd, append([]string{"--log-format", "json"}, args...)...)
}

// StartTestNode runs integration/testnode with args and waits until it
// serves.
func StartTestNode(t testing.TB, args ...string) *Meshd {
	t.Helper()
	return startNode(t, Build(t).TestNode, args...)
}

func startNode(t testing.TB, bin string, args ...string) *Meshd {
	t.Helper()
	p := Start(t, bin, args...)
	// Longer than a node's own bound on joining, so that a node that cannot
	// join is seen saying why rather than cut short.
	m := p.WaitLine(t, servingRe, mesh.DefaultStartTimeout+15*time.Second)
	md := &Meshd{Process: p, Node: m[1], NATSURL: m[2]}
	// The log line naming the HTTP address precedes the serving line, but on
	// the other pipe: poll for it.
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if h := httpRe.FindStringSubmatch(p.Stderr()); h != nil {
			md.HTTPAddr = h[1]
			break
		}
	}
	return md
}

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }
