package daemon

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/natsmesh/natsmesh/profiles"
	"github.com/natsmesh/natsmesh/subjects"
)

// Accounts of the embedded server.
const (
	// EmbeddedAccount is the application account mesh nodes use; a client
	// that connects to the embedded server without credentials lands in it.
	EmbeddedAccount = "MESH"
	// EmbeddedSystemAccount is the embedded server's system account.
	EmbeddedSystemAccount = "SYS"
	// EmbeddedCallerAccount is, with auth on, the caller account of the
	// embedded server (profiles.MultiAccountConf): it holds the client
	// user and imports the ingress from EmbeddedAccount sharing requestor
	// info.
	EmbeddedCallerAccount = "CALLERS"
	// AdvisorySubjectEmbedded is the client-disconnect advisory of
	// EmbeddedAccount as a mesh node subscribes to it on its own
	// connection: the import keeps the subject of the system account's
	// export.
	AdvisorySubjectEmbedded = "$SYS.ACCOUNT." + EmbeddedAccount + ".DISCONNECT"
)

// Ping settings of the embedded server: the server pings a silent client
// every EmbeddedPingInterval and closes it after EmbeddedPingMax unanswered
// pings, so a frozen (SIGSTOPped, wedged) client is disconnected — and its
// advisory sent — about 1.2 s after it froze, rather than after the default
// 2 min × 2.
const (
	EmbeddedPingInterval = 500 * time.Millisecond
	EmbeddedPingMax      = 2
)

// embeddedAccountsConf is the account part of the embedded server's
// configuration, in nats-server config syntax. The system account exports
// only MESH's disconnect advisory, and only to MESH; MESH imports it under
// the same subject. The user "mesh" has no password: it exists for
// no_auth_user, and the server listens on loopback by default.
const embeddedAccountsConf = embeddedPingConf + AccountsConf

const embeddedPingConf = `
ping_interval: "500ms"
ping_max: 2

`

// AccountsConf is the account configuration natsmesh needs from a NATS
// server, as docs/operations.md gives it to operators: the system account
// SYS exports the client-disconnect advisory of the application account
// MESH, to MESH only; MESH has JetStream and imports the advisory under the
// same subject; a client without credentials lands in MESH.
const AccountsConf = `accounts {
  SYS {
    exports: [{stream: "$SYS.ACCOUNT.MESH.DISCONNECT", accounts: [MESH]}]
  }
  MESH {
    jetstream: enabled
    users: [{user: mesh}]
    imports: [{stream: {account: SYS, subject: "$SYS.ACCOUNT.MESH.DISCONNECT"}}]
  }
}
system_account: SYS
no_auth_user: mesh
`

// EmbeddedOptions returns the options of meshd's embedded nats-server:
//
//   - clients on listen ("host:port"; port 0 picks a free port, an empty host
//     means 127.0.0.1 — the server stays on loopback unless told otherwise);
//   - JetStream with its store in dataDir;
//   - an application account MESH (EmbeddedAccount) with JetStream, where a
//     client without credentials lands (no_auth_user), and a system account
//     SYS (EmbeddedSystemAccount);
//   - SYS exports the client-disconnect advisory of MESH and MESH imports it,
//     so a mesh node sees its peers' connections close by subscribing to
//     AdvisorySubjectEmbedded on its ordinary connection;
//   - ping_interval 500ms and ping_max 2 (EmbeddedPingInterval,
//     EmbeddedPingMax), so a frozen client is dropped in about 1.2 s;
//   - no signal handling and no logging (the server runs inside meshd).
//
// The accounts are generated as nats-server configuration and parsed by the
// server's own parser. On an external cluster the operator adds the same
// two lines to the account configuration, the export in the system account
// and the import in the account the mesh nodes use (here APP; the
// advisory subject then is $SYS.ACCOUNT.APP.DISCONNECT):
//
//	exports: [{stream: "$SYS.ACCOUNT.APP.DISCONNECT", accounts: [APP]}]
//	imports: [{stream: {account: SYS, subject: "$SYS.ACCOUNT.APP.DISCONNECT"}}]
//
// Without them the subscription is valid but silent, and departures are
// detected by the registry heartbeat's TTL only (docs/operations.md).
func EmbeddedOptions(listen, dataDir, serverName string) (*server.Options, error) {
	return embeddedOptions(listen, dataDir, serverName, embeddedAccountsConf)
}

// EmbeddedAuthOptions is [EmbeddedOptions] with auth (meshd --auth), in
// the production (multi-account) mode of profiles.MultiAccountConf, as
// docs/operations.md gives it for an external cluster: the account MESH
// holds two nkey users, keys.Node and keys.Operator, with the node and
// operator permission profiles of package profiles for prefix; the caller
// account CALLERS (EmbeddedCallerAccount) holds keys.Client with the
// client profile and imports the ingress, so the nodes learn each
// caller's account and user from Nats-Request-Info. There is no
// no_auth_user, so a client without one of the keys is refused.
func EmbeddedAuthOptions(listen, dataDir, serverName string, prefix subjects.Prefix, keys AuthKeys) (*server.Options, error) {
	m := profiles.Mesh{Prefix: prefix, Account: EmbeddedAccount, SystemAccount: EmbeddedSystemAccount}
	acc, err := profiles.MultiAccountConf(m, []profiles.User{
		{NKey: keys.Node, Profile: profiles.Node(m)},
		{NKey: keys.Operator, Profile: profiles.Operator(m)},
	}, []profiles.Tenant{{Account: EmbeddedCallerAccount, Users: []profiles.User{
		{NKey: keys.Client, Profile: profiles.Client(m)},
	}}})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return embeddedOptions(listen, dataDir, serverName, embeddedPingConf+acc)
}

func embeddedOptions(listen, dataDir, serverName, conf string) (*server.Options, error) {
	host, portStr, err := net.SplitHostPort(listen)
	if err != nil {
		return nil, fmt.Errorf("%w: listen %q: %w", ErrInvalidConfig, listen, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 0 || port > 65535 {
		return nil, fmt.Errorf("%w: listen %q: bad port", ErrInvalidConfig, listen)
	}
	if port == 0 {
		port = server.RANDOM_PORT
	}
	if host == "" {
		host = "127.0.0.1"
	}
	if dataDir == "" {
		return nil, fmt.Errorf("%w: empty data dir", ErrInvalidConfig)
	}
	opts := &server.Options{}
	if err := opts.ProcessConfigString(conf); err != nil {
		// Warnings only (no errors) are not fatal, as in
		// server.ProcessConfigFile.
		var cerr interface{ Errors() []error }
		if !errors.As(err, &cerr) || len(cerr.Errors()) > 0 {
			return nil, fmt.Errorf("daemon: embedded NATS server config: %w", err)
		}
	}
	// Values that come from the caller are set as fields, not spliced into
	// the config text, so no quoting is involved.
	opts.ServerName = serverName
	opts.Host = host
	opts.Port = port
	opts.JetStream = true
	opts.StoreDir = dataDir
	opts.NoSigs = true
	opts.NoLog = true
	return opts, nil
}
