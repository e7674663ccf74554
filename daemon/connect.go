package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsmesh/natsmesh/mesh/membership"
	"github.com/natsmesh/natsmesh/profiles"
)

// checkJetStream makes sure the account has JetStream before the node joins
// the membership: without it the registry's requests would only time out.
// A server or account without JetStream answers at once (no responders on
// the JetStream API, or error 10039).
func checkJetStream(ctx context.Context, nc *nats.Conn) error {
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("daemon: JetStream: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, jetStreamWait)
	defer cancel()
	for {
		actx, acancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := js.AccountInfo(actx)
		acancel()
		switch {
		case err == nil:
			return nil
		case deniedJetStream(nc):
			return fmt.Errorf("%w: this NATS user may not use the JetStream API at %s (%v): meshd needs the node profile's user (SECURITY.md)", ErrNotPermitted, nc.ConnectedUrlRedacted(), nc.LastError())
		case errors.Is(err, jetstream.ErrJetStreamNotEnabled), errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount):
			return fmt.Errorf("%w at %s: the membership (node registry and address directory) needs JetStream; enable it for the account, or run --standalone for a one-node mesh", ErrNoJetStream, nc.ConnectedUrlRedacted())
		case ctx.Err() != nil:
			return fmt.Errorf("daemon: JetStream on the NATS account at %s did not answer in %v (%v); the membership needs it, or run --standalone", nc.ConnectedUrlRedacted(), jetStreamWait, err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// deniedJetStream reports whether the server refused this connection a
// publish to the JetStream API (a permissions violation: the user is not
// the node profile's), which no wait cures.
func deniedJetStream(nc *nats.Conn) bool {
	le := nc.LastError()
	return le != nil && strings.Contains(le.Error(), "Permissions Violation") && strings.Contains(le.Error(), "$JS.API")
}

// startEmbedded runs a nats-server in this process on cfg.Listen with
// JetStream in cfg.DataDir.
// The caller holds the data directory's lock.
func startEmbedded(cfg *Config) (*server.Server, error) {
	if _, _, err := net.SplitHostPort(cfg.Listen); err != nil {
		return nil, fmt.Errorf("%w: listen %q: %w", ErrInvalidConfig, cfg.Listen, err)
	}
	// nats-server reports a busy port only in its log; check first so the
	// error is clear.
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("daemon: embedded NATS server cannot listen on %s: %w", cfg.Listen, err)
	}
	bound := ln.Addr().String()
	_ = ln.Close()
	var opts *server.Options
	if cfg.Auth {
		var keys AuthKeys
		if keys, err = EnsureAuthKeys(cfg.AuthDir); err == nil {
			opts, err = EmbeddedAuthOptions(bound, cfg.DataDir, "meshd-"+cfg.Name, cfg.Prefix, keys)
			if cfg.NKeyFile == "" && cfg.CredsFile == "" && cfg.User == "" {
				cfg.NKeyFile = keys.NodeSeed()
			}
		}
	} else {
		opts, err = EmbeddedOptions(bound, cfg.DataDir, "meshd-"+cfg.Name)
	}
	if err != nil {
		return nil, fmt.Errorf("daemon: embedded NATS server: %w", err)
	}
	if cfg.LeafRemote != "" {
		if err := leafOptions(opts, cfg.LeafRemote, cfg.LeafCreds); err != nil {
			return nil, err
		}
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("daemon: embedded NATS server: %w", err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(15 * time.Second) {
		ns.Shutdown()
		return nil, fmt.Errorf("daemon: embedded NATS server on %s not ready in 15s", cfg.Listen)
	}
	if cfg.LeafRemote != "" {
		// The registry is the hub's: wait for the leaf connection before
		// the node looks for JetStream.
		deadline := time.Now().Add(LeafConnectTimeout)
		for ns.NumLeafNodes() == 0 {
			if time.Now().After(deadline) {
				ns.Shutdown()
				return nil, fmt.Errorf("daemon: the embedded leaf server did not connect to its hub %s in %v (a leafnodes listener there, and the login it wants?)", cfg.LeafRemote, LeafConnectTimeout)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return ns, nil
}

// LeafConnectTimeout bounds how long a leaf node's start waits for its
// leaf connection to the hub.
const LeafConnectTimeout = 15 * time.Second

// ValidateLeafRemote checks a LeafRemote value (meshd --leaf-remote): one
// or more comma-separated leafnode URLs with a host and a port.
func ValidateLeafRemote(remote string) error {
	_, err := leafURLs(remote)
	return err
}

// leafURLs parses the comma-separated leafnode URLs of a hub.
func leafURLs(remote string) ([]*url.URL, error) {
	var out []*url.URL
	for raw := range strings.SplitSeq(remote, ",") {
		raw = strings.TrimSpace(raw)
		u, err := url.Parse(raw)
		if err != nil {
			return nil, fmt.Errorf("%q: %w", raw, err)
		}
		switch u.Scheme {
		case "nats-leaf", "nats", "tls", "ws", "wss":
		default:
			return nil, fmt.Errorf("%q: want nats-leaf://HOST:PORT (or nats://, tls://, ws://, wss://)", raw)
		}
		if u.Hostname() == "" || u.Port() == "" {
			return nil, fmt.Errorf("%q: want HOST:PORT", raw)
		}
		out = append(out, u)
	}
	return out, nil
}

// leafOptions turns the embedded server's options into a leaf node's of
// the hub at remote: no JetStream of its own; the mesh account bound to
// the hub's over the leaf connection, with the hub's JetStream (the empty
// domain) as its default, so the account's JetStream API and KV traffic
// cross the leaf connection (nats-server leafnode.go skips its JetStream
// deny for an account with a default domain of "": the hub's servers need
// the same default_js_domain for the account). The system account is not
// bound: the mesh account's import of its disconnect advisory carries the
// leaf's advisories to the hub and the hub's to the leaf, as account
// traffic.
func leafOptions(opts *server.Options, remote, creds string) error {
	urls, err := leafURLs(remote)
	if err != nil {
		return fmt.Errorf("%w: leaf remote: %w", ErrInvalidConfig, err)
	}
	opts.JetStream = false
	opts.StoreDir = ""
	opts.JsAccDefaultDomain = map[string]string{EmbeddedAccount: ""}
	opts.LeafNode.Remotes = []*server.RemoteLeafOpts{{URLs: urls, LocalAccount: EmbeddedAccount, Credentials: creds}}
	return nil
}

// connect dials NATS with the configured credentials; it reconnects forever.
func connect(cfg Config, url string, extra ...nats.Option) (*nats.Conn, error) {
	log := cfg.Logger
	opts := []nats.Option{
		nats.Name(membership.ConnNamePrefix + cfg.Name),
		// The node profile's inbox, which callers cannot read.
		nats.CustomInboxPrefix(profiles.NodeInboxPrefix(cfg.Prefix)),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(membership.ClientReconnectWait),
		// A silently cut link is noticed within the fencing delay.
		nats.PingInterval(membership.ClientPingInterval),
		nats.MaxPingsOutstanding(membership.ClientMaxPingsOut),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("NATS disconnected", "err", err)
			}
		}),
		nats.ReconnectHandler(func(c *nats.Conn) { log.Info("NATS reconnected", "url", c.ConnectedUrlRedacted()) }),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			subj := ""
			if sub != nil {
				subj = sub.Subject
			}
			log.Error("NATS async error", "subject", subj, "err", err)
		}),
	}
	opts = append(opts, extra...)
	if cfg.CredsFile != "" {
		opts = append(opts, nats.UserCredentials(cfg.CredsFile))
	}
	if cfg.NKeyFile != "" {
		o, err := nats.NkeyOptionFromSeed(cfg.NKeyFile)
		if err != nil {
			return nil, fmt.Errorf("daemon: nkey: %w", err)
		}
		opts = append(opts, o)
	}
	if cfg.User != "" {
		opts = append(opts, nats.UserInfo(cfg.User, cfg.Password))
	}
	if cfg.TLSCert != "" {
		opts = append(opts, nats.ClientCert(cfg.TLSCert, cfg.TLSKey))
	}
	if cfg.TLSCA != "" {
		opts = append(opts, nats.RootCAs(cfg.TLSCA))
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, fmt.Errorf("daemon: connect to NATS at %s: %w", url, err)
	}
	return nc, nil
}

// redactURLs is remote with any password in its URLs replaced, for logs.
func redactURLs(remote string) string {
	urls, err := leafURLs(remote)
	if err != nil {
		return "(invalid)"
	}
	out := make([]string, len(urls))
	for i, u := range urls {
		out[i] = u.Redacted()
	}
	return strings.Join(out, ",")
}
