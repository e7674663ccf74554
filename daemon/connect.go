package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
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
			return fmt.Errorf("%w: this NATS user may not use the JetStream API at %s (%v): meshd needs the node profile's user (SECURITY.md)", ErrInvalidConfig, nc.ConnectedUrlRedacted(), nc.LastError())
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
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("daemon: embedded NATS server: %w", err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(15 * time.Second) {
		ns.Shutdown()
		return nil, fmt.Errorf("daemon: embedded NATS server on %s not ready in 15s", cfg.Listen)
	}
	return ns, nil
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
