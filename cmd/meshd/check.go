package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/natsmesh/natsmesh/daemon"
	"github.com/natsmesh/natsmesh/hubs"
	"github.com/natsmesh/natsmesh/internal/natsauth"
)

// Every setting is checked where its value is set, so that its error names
// where it came from: on the command line pflag names the flag, from the
// environment envflag names the variable. What depends on two settings is
// checked after both are set (checkSettings), and what the start-up meets
// first (a busy port, a data directory that cannot be made) is tried before
// the node starts (preflight), each naming its settings' origins through
// envflag.Set.Origin.

// durationValue is a duration flag that refuses a negative value.
type durationValue struct{ p *time.Duration }

func nonNegativeDuration(p *time.Duration, def time.Duration) *durationValue {
	*p = def
	return &durationValue{p}
}

func (d *durationValue) String() string { return d.p.String() }
func (d *durationValue) Type() string   { return "duration" }
func (d *durationValue) Set(v string) error {
	x, err := time.ParseDuration(v)
	if err != nil {
		return err
	}
	if x < 0 {
		return errors.New("want a duration of 0 or more")
	}
	*d.p = x
	return nil
}

// intValue is an int flag that refuses a negative value.
type intValue struct{ p *int }

func nonNegativeInt(p *int, def int) *intValue {
	*p = def
	return &intValue{p}
}

func (i *intValue) String() string { return strconv.Itoa(*i.p) }
func (i *intValue) Type() string   { return "int" }
func (i *intValue) Set(v string) error {
	x, err := strconv.ParseInt(v, 0, strconv.IntSize)
	if err != nil {
		return err
	}
	if x < 0 {
		return errors.New("want 0 or more")
	}
	*i.p = int(x)
	return nil
}

// optional makes a check accept the empty value (the setting unset).
func optional(check func(string) error) func(string) error {
	return func(v string) error {
		if v == "" {
			return nil
		}
		return check(v)
	}
}

// checkAddr checks a host:port listen address, port 0-65535.
func checkAddr(v string) error {
	_, port, err := net.SplitHostPort(v)
	if err != nil {
		var ae *net.AddrError
		if errors.As(err, &ae) {
			return fmt.Errorf("%s (want HOST:PORT)", ae.Err)
		}
		return err
	}
	if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
		return fmt.Errorf("port %q is not 0-65535", port)
	}
	return nil
}

// checkKinds checks a comma-separated list of hub kinds against the
// built-in ones.
func checkKinds(v string) error {
	for k := range strings.SplitSeq(v, ",") {
		if k = strings.TrimSpace(k); k != "" && !slices.Contains(hubs.Names(), k) {
			return fmt.Errorf("unknown hub kind %q (known: %s)", k, strings.Join(hubs.Names(), ", "))
		}
	}
	return nil
}

// checkDir accepts a directory, or a path where one can be made: a path
// that names something else is refused.
func checkDir(v string) error {
	st, err := os.Stat(v)
	if err == nil && !st.IsDir() {
		return fmt.Errorf("%s is not a directory", v)
	}
	return nil
}

// checkSettings checks what depends on more than one setting, after the
// flags and the environment are applied; an error names every setting it
// is about, as its flag or variable.
func (o options) checkSettings() error {
	e := o.env
	if o.password != "" && o.user == "" {
		return fmt.Errorf("%s needs a user (--user, MESHD_USER)", e.Origin("password"))
	}
	var given []string
	for _, f := range []struct{ flag, v string }{{"creds", o.creds}, {"nkey", o.nkey}, {"user", o.user}} {
		if f.v != "" {
			given = append(given, e.Origin(f.flag))
		}
	}
	if len(given) > 1 {
		return fmt.Errorf("give one of --creds, --nkey and --user, not both %s", strings.Join(given, " and "))
	}
	switch {
	case o.tlsCert != "" && o.tlsKey == "":
		return fmt.Errorf("%s needs its key (--tls-key, MESHD_TLS_KEY)", e.Setting("tls-cert"))
	case o.tlsKey != "" && o.tlsCert == "":
		return fmt.Errorf("%s needs its certificate (--tls-cert, MESHD_TLS_CERT)", e.Setting("tls-key"))
	case o.tlsCert != "":
		if err := natsauth.CheckClientCert(o.tlsCert, o.tlsKey); err != nil {
			return fmt.Errorf("%s and %s: %v", e.Setting("tls-cert"), e.Setting("tls-key"), err)
		}
	}
	if !o.standalone {
		hb, ttl := o.heartbeat, o.ttl
		if hb == 0 {
			hb = defaultHeartbeat
		}
		if ttl == 0 {
			ttl = defaultTTL
		}
		if hb >= ttl {
			return fmt.Errorf("the TTL (%s, %v) must exceed the heartbeat (%s, %v)", e.Origin("ttl"), ttl, e.Origin("heartbeat"), hb)
		}
	}
	if o.natsURL != "" {
		if o.auth {
			return fmt.Errorf("%s secures the embedded server, and %s joins an external one: there, connect with credentials of the node profile (--creds, --nkey or --user)", e.Origin("auth"), e.Setting("nats-url"))
		}
		return nil
	}
	if !o.auth && !o.insecureListen && !loopback(o.listen) {
		return fmt.Errorf("refusing %s without auth: any client that reaches it could forge answers, advisories and registry entries (use --auth, or --insecure-listen to allow it)", e.Setting("listen"))
	}
	return nil
}

// loopback reports whether a listen address is on the loopback interface.
func loopback(listen string) bool {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// preflight tries what the start-up would meet first with a setting's
// value — the embedded server's data directory and port, the HTTP port — so
// that the error names the setting (the node could not start: exit 2).
func (o options) preflight() error {
	e := o.env
	// A data directory held by another meshd first: the likeliest reason
	// its ports are taken too is that very process.
	if o.natsURL == "" || o.dataDirSet {
		if err := daemon.CheckDataDir(o.dataDir); err != nil {
			return err
		}
	}
	if o.natsURL == "" {
		if err := os.MkdirAll(o.dataDir, 0o755); err != nil {
			return fmt.Errorf("data dir %s: %v", e.Setting("data-dir"), err)
		}
		if err := tryListen(o.listen); err != nil {
			return fmt.Errorf("the embedded NATS server cannot listen on %s: %v (another meshd or nats-server may run there: pick another --listen, or stop it)", e.Setting("listen"), err)
		}
	}
	if o.http != "" {
		if err := tryListen(o.http); err != nil {
			return fmt.Errorf("HTTP cannot listen on %s: %v (another meshd may run there: pick another --http, --http '' for none, or stop it)", e.Setting("http"), err)
		}
	}
	return nil
}

// tryListen binds addr and closes it again.
func tryListen(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		var oe *net.OpError
		if errors.As(err, &oe) && oe.Err != nil {
			return oe.Err
		}
		return err
	}
	return ln.Close()
}

// loginHint says what to do about a refused login: the credentials used and
// where they came from, or that none were given, and the options that give
// them with the permission profile a node needs.
func (o options) loginHint() string {
	var used string
	switch {
	case o.creds != "":
		used = "the credentials file of " + o.env.Origin("creds")
	case o.nkey != "":
		used = "the nkey seed of " + o.env.Origin("nkey")
	case o.user != "":
		used = "the user and password of " + o.env.Origin("user")
	}
	give := "--creds FILE, --nkey FILE or --user NAME with --password (MESHD_CREDS, MESHD_NKEY, MESHD_USER/MESHD_PASSWORD) of a user with the node profile (SECURITY.md, docs/operations.md)"
	if used == "" {
		return "no credentials were given; give " + give
	}
	return "it does not accept " + used + "; check them, or give " + give
}

// clusterName checks a NATS cluster name: printable ASCII without spaces
// or the subject metacharacters (the server's own rule for a cluster name
// is "no spaces"; the mesh also keeps it usable in a subject).
func clusterName(v string) error {
	for _, r := range v {
		if r <= ' ' || r > '~' || r == '.' || r == '*' || r == '>' {
			return fmt.Errorf("%q is not a NATS cluster name (printable ASCII without spaces, '.', '*' or '>')", v)
		}
	}
	return nil
}
