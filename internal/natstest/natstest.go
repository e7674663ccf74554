// Package natstest runs real, in-process NATS servers for tests: JetStream
// on, a random loopback port, a temporary store directory, and shutdown
// registered with t.Cleanup. It never mocks NATS.
package natstest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// Option adjusts the server options before the server starts.
type Option func(*server.Options)

// WithoutJetStream turns JetStream off.
func WithoutJetStream() Option { return func(o *server.Options) { o.JetStream = false } }

// WithMaxPayload sets the server's max_payload in bytes.
func WithMaxPayload(n int32) Option { return func(o *server.Options) { o.MaxPayload = n } }

// Environment of a test run under given accounts (profiles/suites_test.go
// writes them: every connection with the node permission profile):
// EnvAccounts names a nats-server config fragment every RunServer applies,
// EnvInbox the inbox prefix every Connect uses.
const (
	EnvAccounts = "NATSMESH_TEST_ACCOUNTS"
	EnvInbox    = "NATSMESH_TEST_INBOX"
)

// WithConfig applies nats-server configuration text (accounts, users,
// permissions, in the server's own syntax, parsed by its own parser) over
// the defaults; host, port and store stay RunServer's.
func WithConfig(conf string) Option {
	return func(o *server.Options) {
		host, port, store := o.Host, o.Port, o.StoreDir
		if err := o.ProcessConfigString(conf); err != nil {
			var cerr interface{ Errors() []error }
			if !errors.As(err, &cerr) || len(cerr.Errors()) > 0 {
				panic(fmt.Sprintf("natstest: server config: %v", err))
			}
		}
		o.Host, o.Port, o.StoreDir = host, port, store
	}
}

// RunServer starts an in-process nats-server on 127.0.0.1 with a random port
// and JetStream in t.TempDir(), waits until it accepts connections, and shuts
// it down when the test ends.
func RunServer(t testing.TB, opts ...Option) *server.Server {
	t.Helper()
	o := &server.Options{
		Host:      "127.0.0.1",
		Port:      -1,
		NoLog:     true,
		NoSigs:    true,
		JetStream: true,
		StoreDir:  t.TempDir(),
	}
	return start(t, o, opts)
}

// RunConfig starts an in-process nats-server from a server configuration
// text (accounts, TLS, operator JWTs, ...) as RunServer does: it listens on
// a random loopback port unless conf says otherwise, with logging and
// signal handling off, and shuts it down when the test ends. conf may name
// files the test wrote; a JetStream store_dir should be in t.TempDir().
func RunConfig(t testing.TB, conf string, opts ...Option) *server.Server {
	t.Helper()
	f := filepath.Join(t.TempDir(), "nats-server.conf")
	if err := os.WriteFile(f, []byte(conf), 0o600); err != nil {
		t.Fatalf("natstest: %v", err)
	}
	o, err := server.ProcessConfigFile(f)
	if err != nil {
		t.Fatalf("natstest: server config: %v", err)
	}
	if o.Host == "" {
		o.Host = "127.0.0.1"
	}
	if o.Port == 0 {
		o.Port = -1
	}
	o.NoLog, o.NoSigs = true, true
	return start(t, o, opts)
}

// Connect opens a nats.go connection to s, closed when the test ends. An
// asynchronous error handler fails the test: a protocol error (for instance
// an invalid subject) must never pass unnoticed.
func Connect(t testing.TB, s *server.Server, opts ...nats.Option) *nats.Conn {
	t.Helper()
	return ConnectURL(t, s.ClientURL(), opts...)
}

// ConnectURL is [Connect] for a URL.
func ConnectURL(t testing.TB, url string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	var inbox []nats.Option
	if p := os.Getenv(EnvInbox); p != "" {
		inbox = append(inbox, nats.CustomInboxPrefix(p))
	}
	all := append(inbox,
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			if sub == nil && !errors.Is(err, nats.ErrSlowConsumer) {
				// The connection's own I/O error (a server the test shut
				// down: "write: broken pipe"): its reconnect handles it.
				t.Logf("natstest: async connection error: %v", err)
				return
			}
			subj := ""
			if sub != nil {
				subj = sub.Subject
			}
			t.Errorf("natstest: async error on subscription %q: %v", subj, err)
		}))
	all = append(all, opts...)
	nc, err := nats.Connect(url, all...)
	if err != nil {
		t.Fatalf("natstest: connect %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// Eventually polls cond every few milliseconds until it is true or timeout
// passes, then fails the test with msg. It is the tests' only way to wait
// (with Poll, for a test that reports the last state it saw itself).
func Eventually(t testing.TB, timeout time.Duration, cond func() bool, msg string, args ...any) {
	t.Helper()
	if !Poll(timeout, cond) {
		t.Fatalf("natstest: condition not met in %v: "+msg, append([]any{timeout}, args...)...)
	}
}

// Poll polls cond as Eventually does and reports whether it became true
// within timeout.
func Poll(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	wait := time.Millisecond
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(wait)
		if wait < 20*time.Millisecond {
			wait *= 2
		}
	}
	return true
}

// start applies the run's accounts (EnvAccounts) and opts to o, starts the
// server, waits until it is ready and shuts it down when the test ends.
func start(t testing.TB, o *server.Options, opts []Option) *server.Server {
	t.Helper()
	if conf := os.Getenv(EnvAccounts); conf != "" {
		// Every server of the run gets these accounts (say, the node
		// permission profile as no_auth_user): the suites run under them.
		b, err := os.ReadFile(conf)
		if err != nil {
			t.Fatalf("natstest: %s: %v", EnvAccounts, err)
		}
		WithConfig(string(b))(o)
	}
	for _, opt := range opts {
		opt(o)
	}
	s, err := server.NewServer(o)
	if err != nil {
		t.Fatalf("natstest: new server: %v", err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		t.Fatalf("natstest: server not ready in 10s")
	}
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	return s
}
