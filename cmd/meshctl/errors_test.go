package main

import (
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nkeys"
	"github.com/spf13/pflag"

	"github.com/natsmesh/natsmesh/internal/natstest"
)

// badURLs are malformed NATS server URLs a trial gave (issue 24) and their
// kin: each is bad input, not an unreachable server.
var badURLs = []string{
	"nats//127.0.0.1::4222", "nats://127.0.0.1::4222", "http://x", "nats://127.0.0.1:99999",
	"nats://127.0.0.1:4222,nats//127.0.0.1:4223", "nats://[::1", " , ",
}

// writeContext saves a nats CLI context file named name under the test's
// own XDG_CONFIG_HOME.
func writeContext(t *testing.T, name string, fields map[string]any) {
	t.Helper()
	config := t.TempDir()
	t.Setenv("XDG_CONFIG_HOME", config)
	dir := filepath.Join(config, "nats", "context")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(fields)
	if err := os.WriteFile(filepath.Join(dir, name+".json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestMalformedURL: a malformed --server, NATS_URL or context URL is bad
// input — exit 1 at once, one line naming where it came from and the value
// — never a DNS or dial failure (exit 2).
func TestMalformedURL(t *testing.T) {
	for _, u := range badURLs {
		for _, src := range []string{"--server", "NATS_URL", "context"} {
			t.Run(src+"="+u, func(t *testing.T) {
				args := []string{"nodes"}
				want := src + "=" + `"` + u + `"`
				switch src {
				case "--server":
					args = append([]string{"--server", u}, args...)
				case "NATS_URL":
					t.Setenv("NATS_URL", u)
				case "context":
					writeContext(t, "prod", map[string]any{"url": u})
					args = append([]string{"--context", "prod"}, args...)
					want = `url "` + u + `" of nats context "prod"`
				}
				start := time.Now()
				r := meshctl(t, nil, "", args...)
				wantCode(t, r, exitUsage)
				if !strings.Contains(r.stderr, want) {
					t.Errorf("stderr %q does not name %s", r.stderr, want)
				}
				if strings.Contains(r.stderr, "cannot connect") || strings.Contains(r.stderr, "lookup") {
					t.Errorf("stderr %q: reported as a connection failure", r.stderr)
				}
				if d := time.Since(start); d > 2*time.Second {
					t.Errorf("took %v: it dialed", d)
				}
			})
		}
	}
	// A well-formed list is dialed: an unreachable one is still exit 2,
	// naming the variable it came from.
	r := meshctl(t, nil, "", "--server", "nats://127.0.0.1:1, 127.0.0.1:2", "nodes")
	wantCode(t, r, exitNoNATS)
	t.Setenv("NATS_URL", "nats://127.0.0.1:1")
	r = meshctl(t, nil, "", "nodes")
	wantCode(t, r, exitNoNATS)
	if !strings.Contains(r.stderr, "cannot connect to NATS at nats://127.0.0.1:1 (NATS_URL)") {
		t.Errorf("stderr %q does not name NATS_URL", r.stderr)
	}
}

// TestLoginRefused: a server that refuses the login (Authorization
// Violation) is exit 2 as before, in one line that says the login was
// refused and how to give credentials — naming the ones given, if any, and
// where they came from.
func TestLoginRefused(t *testing.T) {
	s := natstest.RunConfig(t, `authorization: {users: [{user: op, password: secret}]}`)
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"no credentials", nil, nil, "no credentials were given"},
		{"wrong password", nil, []string{"--user", "op", "--password", "wrong"}, "the user and password of --user"},
		{"wrong password from the environment", map[string]string{"NATS_USER": "op", "NATS_PASSWORD": "wrong"}, nil, "the user and password of NATS_USER"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			r := meshctl(t, s, "", append(tc.args, "nodes")...)
			wantCode(t, r, exitNoNATS)
			for _, want := range []string{"refused the login", "Authorization Violation", tc.want,
				"--creds", "--user", "--password", "--nkey", "nats context", "operator profile"} {
				if !strings.Contains(r.stderr, want) {
					t.Errorf("stderr %q lacks %q", r.stderr, want)
				}
			}
		})
	}
	wantCode(t, meshctl(t, s, "", "--user", "op", "--password", "secret", "nodes"), exitVerdict) // logged in; no node
	// An nkey for a server that has no nkey users: nats.go refuses
	// before it logs in ("nkeys not supported by the server"); the same
	// line says what to do.
	kp, _ := nkeys.CreateUser()
	seed, _ := kp.Seed()
	file := filepath.Join(t.TempDir(), "user.nk")
	if err := os.WriteFile(file, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	r := meshctl(t, s, "", "--nkey", file, "nodes")
	wantCode(t, r, exitNoNATS)
	for _, want := range []string{"refused the login", "nkeys not supported", "the nkey seed of --nkey", "--creds", "--user"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("--nkey to a server without nkeys: stderr %q lacks %q", r.stderr, want)
		}
	}
}

// meshctlFlags are the flags of meshctl's variables.
var meshctlFlags = map[string]string{
	"NATS_URL": "--server", "NATS_CONTEXT": "--context", "NATS_CREDS": "--creds", "NATS_NKEY": "--nkey",
	"NATS_USER": "--user", "NATS_PASSWORD": "--password", "NATS_CERT": "--tls-cert", "NATS_KEY": "--tls-key",
	"NATS_CA": "--tls-ca", "MESHCTL_OUTPUT": "--output", "MESHCTL_PREFIX": "--prefix", "MESHCTL_TIMEOUT": "--timeout",
}

// TestEveryVariableNamedInItsError: for every variable meshctl reads, a
// value it refuses — by the flag's parser, by a check of the value or of
// two settings together, or a credential or TLS file it cannot use — is
// exit 1 in one line naming the variable; the same settings as flags name
// the flags. A variable without a row here fails the test.
func TestEveryVariableNamedInItsError(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "a-file")
	garbage := filepath.Join(dir, "garbage")
	missing := filepath.Join(dir, "missing")
	seed := filepath.Join(dir, "user.nk")
	user, _ := nkeys.CreateUser()
	s, _ := user.Seed()
	for p, content := range map[string]string{file: "x", garbage: "not a credential\n", seed: string(s)} {
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	rows := []struct {
		key string
		env map[string]string
	}{
		{"MESHCTL_OUTPUT", map[string]string{"MESHCTL_OUTPUT": "yaml"}},
		{"MESHCTL_PREFIX", map[string]string{"MESHCTL_PREFIX": "a..b"}},
		{"MESHCTL_TIMEOUT", map[string]string{"MESHCTL_TIMEOUT": "10"}},
		{"MESHCTL_TIMEOUT", map[string]string{"MESHCTL_TIMEOUT": "-1s"}},
		{"NATS_URL", map[string]string{"NATS_URL": "nats//127.0.0.1::4222"}},
		{"NATS_CONTEXT", map[string]string{"NATS_CONTEXT": "nope"}},
		{"NATS_CONTEXT", map[string]string{"NATS_CONTEXT": "../x"}},
		{"NATS_CREDS", map[string]string{"NATS_CREDS": missing}},
		{"NATS_CREDS", map[string]string{"NATS_CREDS": garbage}},
		{"NATS_NKEY", map[string]string{"NATS_NKEY": missing}},
		{"NATS_NKEY", map[string]string{"NATS_NKEY": garbage}},
		{"NATS_USER", map[string]string{"NATS_USER": "op", "NATS_NKEY": seed}},
		{"NATS_PASSWORD", map[string]string{"NATS_PASSWORD": "secret"}},
		{"NATS_CERT", map[string]string{"NATS_CERT": file}},
		{"NATS_CERT", map[string]string{"NATS_CERT": garbage, "NATS_KEY": file}},
		{"NATS_KEY", map[string]string{"NATS_KEY": file}},
		{"NATS_KEY", map[string]string{"NATS_KEY": missing, "NATS_CERT": file}},
		{"NATS_CA", map[string]string{"NATS_CA": missing}},
		{"NATS_CA", map[string]string{"NATS_CA": garbage}},
	}
	covered := map[string]bool{}
	for _, r := range rows {
		covered[r.key] = true
	}
	// The variables are read off the flags' usage, where envflag lists them.
	newRootCmd(io.Discard, io.Discard).PersistentFlags().VisitAll(func(f *pflag.Flag) {
		open := strings.LastIndex(f.Usage, "(")
		if open < 0 || !strings.HasSuffix(f.Usage, ")") {
			return // no variable
		}
		for _, key := range strings.Split(f.Usage[open+1:len(f.Usage)-1], ", ") {
			if strings.ToUpper(key) != key || !strings.Contains(key, "_") {
				return // a remark in parentheses, not variables
			}
			if !covered[key] {
				t.Errorf("no row for %s (--%s): add a value meshctl refuses", key, f.Name)
			}
			if meshctlFlags[key] != "--"+f.Name {
				t.Errorf("%s is --%s's variable; meshctlFlags says %s", key, f.Name, meshctlFlags[key])
			}
		}
	})
	for _, r := range rows {
		t.Run(r.key+"="+r.env[r.key], func(t *testing.T) {
			for k, v := range r.env {
				t.Setenv(k, v)
			}
			res := meshctl(t, nil, "", "nodes")
			wantCode(t, res, exitUsage)
			if !strings.Contains(res.stderr, r.key) {
				t.Errorf("stderr %q does not name %s", res.stderr, r.key)
			}
			for k := range r.env {
				os.Unsetenv(k)
			}
			var args []string
			for k, v := range r.env {
				args = append(args, meshctlFlags[k]+"="+v)
			}
			res = meshctl(t, nil, "", append(args, "nodes")...)
			wantCode(t, res, exitUsage)
			if flag := meshctlFlags[r.key]; !strings.Contains(res.stderr, flag) || strings.Contains(res.stderr, r.key) {
				t.Errorf("%v: stderr %q does not name %s (and only it)", args, res.stderr, flag)
			}
		})
	}
}
