package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/natsmesh/natsmesh/daemon"
	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/hubs"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/mesh"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// runMeshd runs meshd in-process with args and the environment env (other
// MESHD_* variables unset) and returns its exit code and output.
func runMeshd(t *testing.T, env map[string]string, args ...string) (int, string, string) {
	t.Helper()
	withContainerEnv(t, env)
	var out, errb bytes.Buffer
	sig := make(chan os.Signal)
	code := run(args, &out, &errb, sig)
	return code, out.String(), errb.String()
}

// oneLineStartingWith fails unless s is exactly one line starting with prefix.
func oneLineStartingWith(t *testing.T, s, prefix string) {
	t.Helper()
	if !strings.HasPrefix(s, prefix) || strings.Count(s, "\n") != 1 || !strings.HasSuffix(s, "\n") {
		t.Errorf("stderr %q: want one line starting with %q", s, prefix)
	}
}

// TestEnvRejectedLikeFlags: every environment value the flag's parser
// rejects exits 1 with one line naming the variable — the same values a
// trial found silently ignored — and the command line rejects it too.
func TestEnvRejectedLikeFlags(t *testing.T) {
	for _, tc := range []struct{ key, val string }{
		{"MESHD_DRAIN_TIMEOUT", "10"}, {"MESHD_DRAIN_TIMEOUT", "bogus"}, {"MESHD_DRAIN_TIMEOUT", ""},
		{"MESHD_KV_REPLICAS", "three"}, {"MESHD_TTL", "zz"}, {"MESHD_HEARTBEAT", "1"},
		{"MESHD_STANDALONE", "yes"}, {"MESHD_STANDALONE", "on"}, {"MESHD_PLACEMENT_WAIT", "2"},
		{"MESHD_LOG_LEVEL", "loud"}, {"MESHD_LOG_FORMAT", "xml"}, {"MESHD_NAME", "bad.name"},
		{"MESHD_NAME", ""}, {"MESHD_PREFIX", "a..b"}, {"MESHD_PREFIX", "mesh.*"},
	} {
		code, _, stderr := runMeshd(t, map[string]string{tc.key: tc.val}, "--http=", "--listen=127.0.0.1:0")
		if code != 1 {
			t.Errorf("%s=%q: exit %d (stderr %q), want 1", tc.key, tc.val, code, stderr)
			continue
		}
		oneLineStartingWith(t, stderr, "meshd: invalid "+tc.key+"=")
		flag := "--" + strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(tc.key, "MESHD_")), "_", "-")
		if code, _, _ := runMeshd(t, nil, flag+"="+tc.val, "--http=", "--listen=127.0.0.1:0"); code != 1 {
			t.Errorf("%s=%q exits %d on the command line, want 1", flag, tc.val, code)
		}
	}
}

// TestEnvEveryFlag: every flag reads MESHD_<NAME>, through its own parser;
// the command line wins.
func TestEnvEveryFlag(t *testing.T) {
	var cmd *cobra.Command
	for _, b := range []struct{ flag, key, val, want string }{
		{"drain-timeout", "MESHD_DRAIN_TIMEOUT", "10s", "10s"},
		{"kv-replicas", "MESHD_KV_REPLICAS", "3", "3"},
		{"standalone", "MESHD_STANDALONE", "true", "true"},
		{"ttl", "MESHD_TTL", "1m", "1m0s"},
		{"name", "MESHD_NAME", "n-7", "n-7"},
		{"http", "MESHD_HTTP", "", ""},
	} {
		withContainerEnv(t, map[string]string{b.key: b.val})
		cmd = newRootCmd(io.Discard, io.Discard, nil)
		if err := cmd.ParseFlags(nil); err != nil {
			t.Fatal(err)
		}
		if err := cmd.PreRunE(cmd, nil); err != nil {
			t.Fatalf("%s=%q: %v", b.key, b.val, err)
		}
		if got := cmd.Flags().Lookup(b.flag).Value.String(); got != b.want {
			t.Errorf("%s=%q: --%s = %q, want %q", b.key, b.val, b.flag, got, b.want)
		}
	}
	// The command line wins over the environment.
	withContainerEnv(t, map[string]string{"MESHD_DRAIN_TIMEOUT": "bogus", "MESHD_NAME": "from-env"})
	cmd = newRootCmd(io.Discard, io.Discard, nil)
	if err := cmd.ParseFlags([]string{"--drain-timeout=5s", "--name=from-flag"}); err != nil {
		t.Fatal(err)
	}
	if err := cmd.PreRunE(cmd, nil); err != nil {
		t.Fatalf("a bad environment value under a flag given on the command line: %v", err)
	}
	if got := cmd.Flags().Lookup("name").Value.String(); got != "from-flag" {
		t.Errorf("--name = %q, want the command line's", got)
	}
	// Every flag but help names its variable in its usage.
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if f.Name == "help" || f.Name == "version" {
			return
		}
		key := "MESHD_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if !strings.Contains(f.Usage, "("+key+")") {
			t.Errorf("--%s: usage %q does not name %s", f.Name, f.Usage, key)
		}
	})
}

// TestVersion: --version prints the release (what meshctl nodes shows),
// then the module version from the build info.
func TestVersion(t *testing.T) {
	code, stdout, stderr := runMeshd(t, nil, "--version")
	if code != 0 || !strings.HasPrefix(stdout, "meshd "+mesh.Version+", build ") || strings.Count(stdout, "\n") != 1 || stderr != "" {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}

// TestNoJetStream: without JetStream on the server, or on the account, meshd
// exits 2 at start with one line that says JetStream.
func TestNoJetStream(t *testing.T) {
	noJS := natstest.RunServer(t, natstest.WithoutJetStream())
	dir := t.TempDir()
	noJSAccount := natstest.RunConfig(t, fmt.Sprintf(`
jetstream: {store_dir: %q}
accounts: {
  JS: {jetstream: enabled, users: [{user: js, password: js}]}
  PLAIN: {users: [{user: plain, password: plain}]}
}`, filepath.Join(dir, "js")))
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"server without JetStream", []string{"--nats-url", noJS.ClientURL()}},
		{"account without JetStream", []string{"--nats-url", noJSAccount.ClientURL(), "--user", "plain", "--password", "plain"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			code, _, stderr := runMeshd(t, nil, append(tc.args, "--name", "n1", "--http=", "--log-level=error")...)
			t.Logf("exit %d after %v: %s", code, time.Since(start).Round(time.Millisecond), stderr)
			if code != 2 {
				t.Fatalf("exit %d, want 2; stderr %q", code, stderr)
			}
			oneLineStartingWith(t, stderr, "meshd: ")
			if !strings.Contains(stderr, "JetStream") || !strings.Contains(stderr, "--standalone") {
				t.Errorf("stderr %q does not say JetStream is missing and what to do", stderr)
			}
		})
	}
	// --standalone needs no JetStream.
	withContainerEnv(t, nil)
	sig := make(chan os.Signal, 1)
	var out, errb bytes.Buffer
	done := make(chan int, 1)
	go func() {
		done <- runWith([]string{"--nats-url", noJS.ClientURL(), "--standalone", "--name", "n1", "--http=", "--log-level=error"}, &out, &errb, sig, func(daemon.Info) { sig <- os.Interrupt })
	}()
	if code := <-done; code != 0 {
		t.Fatalf("--standalone without JetStream: exit %d, stderr %q", code, errb.String())
	}
}

// TestConnectionName: meshd's NATS connection is named as
// docs/operations.md says.
func TestConnectionName(t *testing.T) {
	doc, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), "connection `natsmesh <name>`") {
		t.Fatal("docs/operations.md does not say how a node names its connection")
	}
	s := natstest.RunServer(t)
	withContainerEnv(t, nil)
	sig := make(chan os.Signal, 1)
	names := make(chan []string, 1)
	var out, errb bytes.Buffer
	code := runWith([]string{"--nats-url", s.ClientURL(), "--name", "conn-7", "--http=", "--log-level=error"}, &out, &errb, sig, func(daemon.Info) {
		cz, err := s.Connz(&server.ConnzOptions{})
		var got []string
		if err == nil {
			for _, c := range cz.Conns {
				got = append(got, c.Name)
			}
		}
		names <- got
		sig <- os.Interrupt
	})
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	got := <-names
	if !slices.Contains(got, "natsmesh conn-7") {
		t.Fatalf("connections %q, want one named %q", got, "natsmesh conn-7")
	}
}

// TestPlacementWaitFlag: --placement-wait reaches the node's ingress: with
// a long wait a request for a kind nobody hosts is still unanswered when a
// short client timeout ends; with the default it is answered
// Unavailable/no-placement.
func TestPlacementWaitFlag(t *testing.T) {
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	ask := func(timeout time.Duration) (*nats.Msg, error) {
		m := nats.NewMsg(subjects.DefaultPrefix.Ingress("nokind/x", ""))
		m.Header.Set(hub.HeaderID, nuid.Next())
		return nc.RequestMsg(m, timeout)
	}
	for _, tc := range []struct {
		wait  string
		check func(*nats.Msg, error) error
	}{
		{"5s", func(_ *nats.Msg, err error) error {
			if !errors.Is(err, nats.ErrTimeout) {
				return fmt.Errorf("answered within 300ms (%v) despite a 5 s placement wait", err)
			}
			return nil
		}},
		{"0s", func(m *nats.Msg, err error) error {
			if err != nil || m.Header.Get(verdict.HeaderReason) != "no-placement" || m.Header.Get(verdict.HeaderVerdict) != "Unavailable" {
				return fmt.Errorf("reply %v, err %v; want Unavailable/no-placement", m, err)
			}
			return nil
		}},
	} {
		withContainerEnv(t, nil)
		sig := make(chan os.Signal, 1)
		var out, errb bytes.Buffer
		result := make(chan error, 1)
		code := runWith([]string{"--nats-url", s.ClientURL(), "--name", "pw", "--http=", "--log-level=error", "--placement-wait", tc.wait, "--drain-timeout", "10s"}, &out, &errb, sig,
			func(daemon.Info) {
				go func() {
					timeout := 300 * time.Millisecond
					if tc.wait == "0s" {
						timeout = 20 * time.Second
					}
					result <- tc.check(ask(timeout))
					sig <- os.Interrupt
				}()
			})
		if code != 0 {
			t.Fatalf("--placement-wait %s: exit %d: %s", tc.wait, code, errb.String())
		}
		if err := <-result; err != nil {
			t.Errorf("--placement-wait %s: %v", tc.wait, err)
		}
	}
}

// TestIngressCallerRateFlag: --ingress-caller-rate limits one caller's
// ingress deliveries: a burst beyond the rate's bucket is answered
// Ignored/storm-breaker, the rest Accepted.
func TestIngressCallerRateFlag(t *testing.T) {
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	withContainerEnv(t, nil)
	sig := make(chan os.Signal, 1)
	var out, errb bytes.Buffer
	result := make(chan error, 1)
	code := runWith([]string{"--nats-url", s.ClientURL(), "--name", "rl", "--http=", "--log-level=error",
		"--ingress-caller-rate", "0.5", "--ingress-caller-burst", "3", "--drain-timeout", "10s"}, &out, &errb, sig,
		func(daemon.Info) {
			go func() {
				defer func() { sig <- os.Interrupt }()
				verdicts := map[string]int{}
				for range 8 {
					m := nats.NewMsg(subjects.DefaultPrefix.Ingress("echo/rl", ""))
					m.Header.Set(hub.HeaderID, nuid.Next())
					r, err := nc.RequestMsg(m, 20*time.Second)
					if err != nil {
						result <- err
						return
					}
					verdicts[r.Header.Get(verdict.HeaderVerdict)+"/"+r.Header.Get(verdict.HeaderReason)]++
				}
				if verdicts["Accepted/"] != 3 || verdicts["Ignored/storm-breaker"] != 5 {
					result <- fmt.Errorf("8 deliveries at once, burst 3 at 0.5/s: %v, want 3 Accepted and 5 Ignored/storm-breaker", verdicts)
					return
				}
				result <- nil
			}()
		})
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if err := <-result; err != nil {
		t.Error(err)
	}
}

// TestSecondMeshdOnTheDataDirNamesIt: the same command run twice (same
// data directory, same ports) is refused for the data directory, which is
// what is wrong, not for the ports the first process holds too.
func TestSecondMeshdOnTheDataDirNamesIt(t *testing.T) {
	withContainerEnv(t, nil)
	dir := t.TempDir()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	listen := ln.Addr().String()
	_ = ln.Close()
	args := []string{"--name", "twice", "--data-dir", dir, "--listen", listen, "--http=", "--log-level=error", "--standalone"}
	sig := make(chan os.Signal, 1)
	first := make(chan int, 1)
	ready := make(chan struct{})
	go func() {
		var out, errb bytes.Buffer
		first <- runWith(args, &out, &errb, sig, func(daemon.Info) { close(ready) })
	}()
	select {
	case <-ready:
	case code := <-first:
		t.Fatalf("first meshd exited %d", code)
	}
	var out, errb bytes.Buffer
	code := runWith(args, &out, &errb, make(chan os.Signal, 1), nil)
	sig <- os.Interrupt
	if c := <-first; c != 0 {
		t.Errorf("first meshd exited %d", c)
	}
	if code != 2 || !strings.Contains(errb.String(), "data directory in use") || strings.Contains(errb.String(), "cannot listen") {
		t.Fatalf("second meshd: exit %d, %q; want exit 2 naming the data directory", code, errb.String())
	}
}

// TestIdleTimeoutFlag: --idle-timeout reaches the node's host: with a short
// one an activation that had a delivery is collected (the node's
// natsmesh_deactivations_total counts it, and a second delivery
// activates the address again); with the default (5 min) it stays live.
func TestIdleTimeoutFlag(t *testing.T) {
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	deliver := func(addr subjects.Address) error {
		m := nats.NewMsg(subjects.DefaultPrefix.Ingress(addr, ""))
		m.Header.Set(hub.HeaderID, nuid.Next())
		r, err := nc.RequestMsg(m, 10*time.Second)
		if err != nil {
			return err
		}
		_, err = verdict.Decode(r.Header)
		return err
	}
	metric := func(httpAddr, name string) (float64, error) {
		resp, err := http.Get("http://" + httpAddr + "/metrics")
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			return 0, err
		}
		for l := range strings.SplitSeq(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, name+" "); ok {
				return strconv.ParseFloat(strings.TrimSpace(v), 64)
			}
		}
		return 0, fmt.Errorf("no %s in /metrics", name)
	}
	for _, tc := range []struct {
		args    []string
		collect bool
	}{
		{[]string{"--idle-timeout", "100ms"}, true},
		{nil, false},
	} {
		sig := make(chan os.Signal, 1)
		var out, errb bytes.Buffer
		result := make(chan error, 1)
		args := append([]string{"--nats-url", s.ClientURL(), "--name", "idle", "--http", "127.0.0.1:0", "--log-level=error", "--drain-timeout", "10s"}, tc.args...)
		code := runWith(args, &out, &errb, sig, func(info daemon.Info) {
			go func() {
				defer func() { sig <- os.Interrupt }()
				addr := subjects.Address(hubs.EchoKind + "/" + nuid.Next())
				if err := deliver(addr); err != nil {
					result <- fmt.Errorf("first delivery: %w", err)
					return
				}
				if !tc.collect {
					// Past many short timeouts: still live, nothing collected.
					deadline := time.Now().Add(time.Second)
					for time.Now().Before(deadline) {
						if d, err := metric(info.HTTPAddr, "natsmesh_deactivations_total"); err != nil || d != 0 {
							result <- fmt.Errorf("with the default idle timeout: deactivations %v (%v)", d, err)
							return
						}
						time.Sleep(50 * time.Millisecond) // polling a counter that must stay 0
					}
					result <- nil
					return
				}
				deadline := time.Now().Add(10 * time.Second)
				for {
					d, err := metric(info.HTTPAddr, "natsmesh_deactivations_total")
					if err == nil && d >= 1 {
						break
					}
					if time.Now().After(deadline) {
						result <- fmt.Errorf("--idle-timeout 100ms: no activation collected within 10 s (deactivations %v, %v)", d, err)
						return
					}
					time.Sleep(20 * time.Millisecond)
				}
				if err := deliver(addr); err != nil {
					result <- fmt.Errorf("delivery after the collection: %w", err)
					return
				}
				result <- nil
			}()
		})
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", tc.args, code, errb.String())
		}
		if err := <-result; err != nil {
			t.Errorf("%v", err)
		}
	}
}

// TestDrainDataDir: `meshd drain` on a directory no meshd holds says there
// is nothing to drain (exit 0); on a directory that does not exist — a
// mistyped --data-dir in a preStop hook — it fails as bad input (exit 1)
// naming the flag, instead of passing as "nothing to drain".
func TestDrainDataDir(t *testing.T) {
	dir := t.TempDir()
	code, out, errOut := runMeshd(t, nil, "drain", "--data-dir", dir, "--timeout", "5s")
	if code != 0 || !strings.Contains(out, "nothing to drain") {
		t.Errorf("drain of an unheld directory: exit %d, %q %q", code, out, errOut)
	}
	missing := filepath.Join(dir, "nonexistent")
	code, out, errOut = runMeshd(t, nil, "drain", "--data-dir", missing, "--timeout", "5s")
	if code != 1 || !strings.Contains(errOut, "--data-dir "+missing+": no such directory") {
		t.Errorf("drain of a missing directory: exit %d, %q %q; want exit 1 naming --data-dir", code, out, errOut)
	}
}
