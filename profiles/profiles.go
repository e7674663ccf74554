// Package profiles writes the NATS permission profiles of a mesh (DESIGN
// §10) once, as nats-server configuration: node, client and operator, in
// two modes. [MultiAccountConf] is production: nodes and operators in the
// mesh account, which exports the ingress <prefix>.in.> as a service that
// caller accounts import sharing requestor info, so the server stamps each
// request's Nats-Request-Info and makes its reply subject (_R_.…).
// [AccountsConf] is the weaker single-account mode: everyone in one
// account, callers told apart by their inbox prefixes. meshd --auth and
// compose apply the multi-account one (package daemon, deploy/nats/),
// docs/operations.md carries its text, and the attack and end-to-end tests
// run against real servers configured from it.
//
//	profile   may publish                                   may subscribe
//	node      <prefix>.>, the JetStream API of the mesh's   <prefix>.>, $SRV.>, the disconnect
//	          three buckets (no update, purge, delete)      advisory of its account, the node
//	          and of the reminders stream, $SRV.>,          inbox, the operator inbox
//	          $SYS.REQ.USER.INFO, _R_.> (service
//	          replies), the client and operator inboxes
//	          and the node inbox
//	client    <prefix>.in.>                                 its inbox (_INBOX.> by default)
//	operator  <prefix>.ctl.>, <prefix>.in.>, $SRV.>         its inbox
//
// No profile but the node's reaches JetStream: every JetStream API request
// is answered on the requester's reply subject by the server itself, which
// may publish anywhere in the account (a direct get with the reply
// $KV.<bucket>.<key> writes the answer into the bucket), so the operator
// reads state through a node's control endpoint, which checks the reply.
//
// Nodes connect with the node inbox prefix ([NodeInboxPrefix]), which no
// other profile may subscribe to: the acceptance replies a node receives for
// its deliveries (and what they carry) are visible to nodes only.
//
// Everything here is pure and safe for concurrent use.
package profiles

import (
	"fmt"
	"strings"

	"github.com/natsmesh/natsmesh/mesh/directory"
	"github.com/natsmesh/natsmesh/mesh/hubstate"
	"github.com/natsmesh/natsmesh/mesh/membership"
	"github.com/natsmesh/natsmesh/mesh/reminders"
	"github.com/natsmesh/natsmesh/subjects"
)

// Defaults of [Mesh].
const (
	DefaultAccount       = "MESH"
	DefaultSystemAccount = "SYS"
	// DefaultInbox is the inbox prefix of nats.go and the nats CLI, which
	// the client and operator profiles may subscribe under.
	DefaultInbox = "_INBOX"
)

// Mesh names what the profiles are written for. The zero value is the
// default mesh: prefix subjects.DefaultPrefix in account MESH, whose
// disconnect advisory is imported as $SYS.ACCOUNT.MESH.DISCONNECT.
type Mesh struct {
	// Prefix is the mesh's subject prefix; zero means
	// subjects.DefaultPrefix.
	Prefix subjects.Prefix
	// Account is the application account the mesh's users live in; zero
	// means DefaultAccount.
	Account string
	// SystemAccount exports the disconnect advisory; zero means
	// DefaultSystemAccount.
	SystemAccount string
	// ClientInbox is the inbox prefix the client profile may subscribe
	// under (Inbox + ".>"); zero means DefaultInbox. Every user of one
	// client inbox prefix can read the others' replies: give each client
	// user its own (say "_INBOX.alice", with nats.CustomInboxPrefix or the
	// nats CLI's --inbox-prefix) to keep callers apart.
	ClientInbox string
	// OperatorInbox is the operator profile's inbox prefix; zero means
	// DefaultInbox.
	OperatorInbox string
}

func (m Mesh) withDefaults() Mesh {
	if m.Prefix == "" {
		m.Prefix = subjects.DefaultPrefix
	}
	if m.Account == "" {
		m.Account = DefaultAccount
	}
	if m.SystemAccount == "" {
		m.SystemAccount = DefaultSystemAccount
	}
	if m.ClientInbox == "" {
		m.ClientInbox = DefaultInbox
	}
	if m.OperatorInbox == "" {
		m.OperatorInbox = DefaultInbox
	}
	return m
}

// Validate reports why m cannot be rendered: an invalid prefix, or an
// account or inbox name that is not one plain subject token sequence.
func (m Mesh) Validate() error {
	m = m.withDefaults()
	if err := m.Prefix.Validate(); err != nil {
		return fmt.Errorf("profiles: %w", err)
	}
	for _, a := range []string{m.Account, m.SystemAccount} {
		if !plain(a, false) {
			return fmt.Errorf("profiles: account %q: want [A-Za-z0-9_-]", a)
		}
	}
	for _, in := range []string{m.ClientInbox, m.OperatorInbox} {
		if !plain(in, true) {
			return fmt.Errorf("profiles: inbox prefix %q: want dot-separated [A-Za-z0-9_-] tokens", in)
		}
		if in == NodeInboxPrefix(m.Prefix) || strings.HasPrefix(in, NodeInboxPrefix(m.Prefix)+".") {
			return fmt.Errorf("profiles: inbox prefix %q is the nodes' own", in)
		}
	}
	return nil
}

// plain reports whether s is non-empty [A-Za-z0-9_-] (and, with dots,
// dot-separated non-empty tokens of it).
func plain(s string, dots bool) bool {
	if s == "" {
		return false
	}
	for tok := range strings.SplitSeq(s, ".") {
		if tok == "" || (!dots && tok != s) {
			return false
		}
		for i := 0; i < len(tok); i++ {
			c := tok[i]
			if !(c == '-' || c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
				return false
			}
		}
	}
	return true
}

// NodeInboxPrefix is the inbox prefix mesh nodes of prefix p connect with
// (nats.CustomInboxPrefix): "_INBOX_" followed by p with dots as
// underscores, e.g. "_INBOX_mesh_v1". Only the node profile may subscribe
// under it.
func NodeInboxPrefix(p subjects.Prefix) string {
	if p == "" {
		p = subjects.DefaultPrefix
	}
	return p.NodeInbox()
}

// AdvisorySubject is the client-disconnect advisory of m's account as its
// nodes subscribe to it (the import keeps the subject).
func (m Mesh) AdvisorySubject() string {
	m = m.withDefaults()
	return "$SYS.ACCOUNT." + m.Account + ".DISCONNECT"
}

// Permissions is one profile: the subjects a user may publish and subscribe
// to. Nothing else is allowed.
type Permissions struct {
	Name      string
	Publish   []string
	Subscribe []string
}

// kvWrite is what a node needs of a KV bucket: bind, create, read
// (direct and by sequence), watch (ordered push consumers and their flow
// control) and write keys. Not update, purge or delete of the bucket's
// stream, nor deletes of its messages by sequence: no node does that, and a
// reflected publish (a reply subject someone else chose) must not be able
// to.
func kvWrite(bucket string) []string {
	s := "KV_" + bucket
	return []string{
		"$JS.API.STREAM.INFO." + s,       // bind
		"$JS.API.STREAM.CREATE." + s,     // the first node creates it
		"$JS.API.STREAM.MSG.GET." + s,    // get (without direct get)
		"$JS.API.DIRECT.GET." + s,        // direct get by sequence
		"$JS.API.DIRECT.GET." + s + ".>", // direct get, last by subject
		"$JS.API.CONSUMER.*." + s,        // watchers: legacy create
		"$JS.API.CONSUMER.*." + s + ".>", // watchers: create, info, delete
		"$JS.FC." + s + ".>",             // watchers' flow control replies
		"$KV." + bucket + ".>",           // puts, creates, updates, deletes
	}
}

// reminderStream is what a node needs of the reminders stream (package
// mesh/reminders): bind and create it, read schedules (direct get, list by
// stream info), create and pull from its one durable consumer, and
// acknowledge fires; update it (a stream an earlier version created gains
// the incarnation subjects: reminders.Open). Its subjects are under
// <prefix>., which nodes publish to anyway. Not purge or delete: Cancel
// writes a tombstone.
func reminderStream(stream string) []string {
	c := stream + "." + reminders.ConsumerName
	return []string{
		"$JS.API.STREAM.INFO." + stream,
		"$JS.API.STREAM.CREATE." + stream,
		"$JS.API.STREAM.UPDATE." + stream,
		"$JS.API.STREAM.MSG.GET." + stream,
		"$JS.API.DIRECT.GET." + stream,
		"$JS.API.DIRECT.GET." + stream + ".>",
		"$JS.API.CONSUMER.CREATE." + c + ".>", // create or update, with its filter
		"$JS.API.CONSUMER.INFO." + c,
		"$JS.API.CONSUMER.MSG.NEXT." + c, // pull
		"$JS.ACK." + c + ".>",            // ack, nak, in progress, term
	}
}

// Subjects outside the mesh's prefix that the node profile publishes to.
const (
	// UserInfoSubject is the server's own "who am I" service: a node asks
	// it for the account it runs in, whose disconnect advisory it then
	// subscribes to (membership.AccountAdvisorySubject).
	UserInfoSubject = membership.UserInfoSubject
	// ServiceReplies are the reply subjects a server makes for requests
	// that crossed a service import (the ingress of the multi-account
	// mode); clients cannot name them as replies (the server refuses a
	// reserved reply), so only answers to imported requests go there.
	ServiceReplies = "_R_.>"
)

// Node is the profile of mesh nodes (meshd, services that embed a node,
// meshctl subscribe and bench): the whole <prefix>.> subject space, the
// JetStream API of the registry, directory and hub state buckets (bind,
// create, get, watch, write keys), the micro service endpoints and
// discovery ($SRV.>), the server's user info (UserInfoSubject), the
// disconnect advisory of m.Account, replies to callers through a service
// import (ServiceReplies), to callers and operators in the mesh account
// (their inboxes) and to other nodes (the node inbox). It may subscribe to
// the operator inbox too, so that meshctl's operator commands (drain,
// nodes, …) also work for a node user.
func Node(m Mesh) Permissions {
	m = m.withDefaults()
	p := string(m.Prefix)
	pub := []string{p + ".>", "$JS.API.INFO"}
	pub = append(pub, kvWrite(membership.BucketName(m.Prefix))...)
	pub = append(pub, kvWrite(directory.BucketName(m.Prefix))...)
	pub = append(pub, kvWrite(hubstate.BucketName(m.Prefix))...)
	pub = append(pub, reminderStream(reminders.StreamName(m.Prefix))...)
	pub = append(pub, "$SRV.>", UserInfoSubject, ServiceReplies, m.ClientInbox+".>", NodeInboxPrefix(m.Prefix)+".>")
	if m.OperatorInbox != m.ClientInbox {
		pub = append(pub, m.OperatorInbox+".>")
	}
	sub := []string{p + ".>", "$SRV.>", m.AdvisorySubject(), NodeInboxPrefix(m.Prefix) + ".>", m.OperatorInbox + ".>"}
	return Permissions{Name: "node", Publish: pub, Subscribe: sub}
}

// Client is the profile of callers through the ingress (nats req, other
// languages): publish <prefix>.in.>, subscribe to its inbox.
func Client(m Mesh) Permissions {
	m = m.withDefaults()
	return Permissions{
		Name:      "client",
		Publish:   []string{string(m.Prefix) + ".in.>"},
		Subscribe: []string{m.ClientInbox + ".>"},
	}
}

// Operator is the profile of meshctl nodes, hubs, stats, drain, send,
// request and state get: the nodes' control endpoints (<prefix>.ctl.>,
// drain and state reads included), the micro service discovery ($SRV.>)
// and the ingress (meshctl send, request); it subscribes to its inbox. It
// has no JetStream API at all: the server answers a JetStream request on
// whatever reply subject the requester names, in the mesh account, so a
// reader of a bucket could make JetStream write into any bucket of the
// mesh (SECURITY.md); meshctl state get reads through a node instead
// (mesh.ControlState). meshctl subscribe and bench act as mesh clients and
// need the node profile.
func Operator(m Mesh) Permissions {
	m = m.withDefaults()
	p := string(m.Prefix)
	pub := []string{p + ".ctl.>", p + ".in.>", "$SRV.>"}
	return Permissions{Name: "operator", Publish: pub, Subscribe: []string{m.OperatorInbox + ".>"}}
}

// Conf renders p as the value of a nats-server user's permissions:
//
//	{publish: {allow: [...]}, subscribe: {allow: [...]}}
func (p Permissions) Conf() string {
	return "{\n" +
		"  publish: {allow: " + list(p.Publish, "  ") + "}\n" +
		"  subscribe: {allow: " + list(p.Subscribe, "  ") + "}\n" +
		"}"
}

func list(subs []string, indent string) string {
	var b strings.Builder
	b.WriteString("[\n")
	for _, s := range subs {
		b.WriteString(indent + "  " + quote(s) + "\n")
	}
	b.WriteString(indent + "]")
	return b.String()
}

// quote writes s as a double-quoted nats-server config string. The subjects
// here never hold quotes or backslashes (validated prefixes and names).
func quote(s string) string { return `"` + s + `"` }

// User is one user of the application account with a profile. Exactly one
// of NKey (a public user nkey, "U…"), or User with Password or PasswordVar
// identifies it.
type User struct {
	NKey     string
	User     string
	Password string
	// PasswordVar names a config variable or environment variable
	// holding the password (rendered unquoted as $NAME, which nats-server
	// resolves when it parses the file).
	PasswordVar string
	Profile     Permissions
}

func (u User) conf(indent string) (string, error) {
	var id string
	switch {
	case u.NKey != "" && u.User == "":
		if !strings.HasPrefix(u.NKey, "U") || !plain(u.NKey, false) {
			return "", fmt.Errorf("profiles: %q is not a public user nkey", u.NKey)
		}
		id = "nkey: " + u.NKey
	case u.User != "" && u.NKey == "" && (u.Password == "") != (u.PasswordVar == ""):
		if !plain(u.User, false) {
			return "", fmt.Errorf("profiles: user name %q: want [A-Za-z0-9_-]", u.User)
		}
		if u.PasswordVar != "" {
			if !plain(u.PasswordVar, false) {
				return "", fmt.Errorf("profiles: password variable %q: want [A-Za-z0-9_-]", u.PasswordVar)
			}
			id = "user: " + u.User + ", password: $" + u.PasswordVar
		} else {
			if strings.ContainsAny(u.Password, "\"\\\n") {
				return "", fmt.Errorf("profiles: user %s: the password holds a quote, backslash or newline", u.User)
			}
			id = "user: " + u.User + ", password: " + quote(u.Password)
		}
	default:
		return "", fmt.Errorf("profiles: a user needs an nkey, or a user name and a password")
	}
	perm := strings.ReplaceAll(u.Profile.Conf(), "\n", "\n"+indent)
	return indent + "# " + u.Profile.Name + " profile\n" + indent + "{" + id + ", permissions: " + perm + "}", nil
}

// AccountsConf renders the accounts section of the single-account mode
// (weaker than [MultiAccountConf]: SECURITY.md): the system account exports the disconnect advisory of the
// application account to it only; the application account has JetStream,
// imports the advisory under the same subject, and holds users, each with
// its profile. There is no no_auth_user: a client without credentials is
// refused. The same text goes on every server of a cluster.
func AccountsConf(m Mesh, users []User) (string, error) {
	if err := m.Validate(); err != nil {
		return "", err
	}
	if len(users) == 0 {
		return "", fmt.Errorf("profiles: no users")
	}
	m = m.withDefaults()
	adv := quote(m.AdvisorySubject())
	us, err := usersConf(users)
	if err != nil {
		return "", err
	}
	return "accounts {\n" +
		"  " + m.SystemAccount + " {\n" +
		"    exports: [{stream: " + adv + ", accounts: [" + m.Account + "]}]\n" +
		"  }\n" +
		"  " + m.Account + " {\n" +
		"    jetstream: enabled\n" +
		"    imports: [{stream: {account: " + m.SystemAccount + ", subject: " + adv + "}}]\n" +
		"    users: [\n" + us + "\n    ]\n" +
		"  }\n" +
		"}\n" +
		"system_account: " + m.SystemAccount + "\n", nil
}

// Tenant is a caller account of the multi-account mode: it imports the
// mesh's ingress and holds callers, normally with the [Client] profile.
// Users of one tenant account share their account's inbox space, as users
// of one account always do; give callers that must not read each other's
// answers accounts of their own.
type Tenant struct {
	// Account names the caller account: [A-Za-z0-9_-], neither the mesh's
	// nor the system account.
	Account string
	// Users are the account's users; at least one.
	Users []User
}

// MultiAccountConf renders the accounts section of the production mode
// (DESIGN §10, SECURITY.md): tenants in their own accounts.
//
//   - The system account exports the client-disconnect advisory of
//     m.Account to m.Account only.
//   - m.Account has JetStream, imports the advisory under the same subject,
//     exports the ingress <prefix>.in.> as a service (response_type
//     singleton: one answer per request) to the tenants' accounts only, and
//     holds meshUsers (the node and operator profiles).
//   - Each tenant account imports the ingress under the same subject with
//     share: true, so the server stamps Nats-Request-Info (the caller's
//     account and user; a value the caller wrote is replaced) on each
//     request it carries into m.Account, and answers through a reply
//     subject of its own making (_R_.…, which no client may name). Tenants
//     have no JetStream and import nothing else: nothing a caller sends
//     reaches the mesh account but an ingress request.
//
// The nodes then take the caller identity from Nats-Request-Info
// (mesh.CallerFromRequestInfo: meshd --caller-identity request-info).
// There is no no_auth_user. The same text goes on every server of a
// cluster. Errors: an invalid m, no mesh user, no tenant, a tenant without
// users, a bad or repeated account name, a bad user.
func MultiAccountConf(m Mesh, meshUsers []User, tenants []Tenant) (string, error) {
	if err := m.Validate(); err != nil {
		return "", err
	}
	if len(meshUsers) == 0 {
		return "", fmt.Errorf("profiles: no users in the mesh account")
	}
	if len(tenants) == 0 {
		return "", fmt.Errorf("profiles: no tenant account")
	}
	m = m.withDefaults()
	seen := map[string]bool{m.Account: true, m.SystemAccount: true}
	var names []string
	for _, t := range tenants {
		if !plain(t.Account, false) {
			return "", fmt.Errorf("profiles: tenant account %q: want [A-Za-z0-9_-]", t.Account)
		}
		if seen[t.Account] {
			return "", fmt.Errorf("profiles: tenant account %q is used twice, or is the mesh or system account", t.Account)
		}
		if len(t.Users) == 0 {
			return "", fmt.Errorf("profiles: tenant account %s has no users", t.Account)
		}
		seen[t.Account] = true
		names = append(names, t.Account)
	}
	mus, err := usersConf(meshUsers)
	if err != nil {
		return "", err
	}
	in := quote(string(m.Prefix) + ".in.>")
	adv := quote(m.AdvisorySubject())
	var b strings.Builder
	b.WriteString("accounts {\n" +
		"  " + m.SystemAccount + " {\n" +
		"    exports: [{stream: " + adv + ", accounts: [" + m.Account + "]}]\n" +
		"  }\n" +
		"  # the mesh: nodes and operators\n" +
		"  " + m.Account + " {\n" +
		"    jetstream: enabled\n" +
		"    imports: [{stream: {account: " + m.SystemAccount + ", subject: " + adv + "}}]\n" +
		"    exports: [{service: " + in + ", accounts: [" + strings.Join(names, ", ") + "], response_type: singleton}]\n" +
		"    users: [\n" + mus + "\n    ]\n" +
		"  }\n")
	for _, t := range tenants {
		us, err := usersConf(t.Users)
		if err != nil {
			return "", err
		}
		b.WriteString("  # callers: the ingress, with their identity shared\n" +
			"  " + t.Account + " {\n" +
			"    imports: [{service: {account: " + m.Account + ", subject: " + in + "}, share: true}]\n" +
			"    users: [\n" + us + "\n    ]\n" +
			"  }\n")
	}
	b.WriteString("}\n" + "system_account: " + m.SystemAccount + "\n")
	return b.String(), nil
}

func usersConf(users []User) (string, error) {
	var us []string
	for _, u := range users {
		s, err := u.conf("      ")
		if err != nil {
			return "", err
		}
		us = append(us, s)
	}
	return strings.Join(us, "\n"), nil
}

// All returns the three profiles of m: node, client, operator.
func All(m Mesh) []Permissions { return []Permissions{Node(m), Client(m), Operator(m)} }
