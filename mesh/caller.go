package mesh

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/subjects"
)

// CallerIdentity says where the ingress takes an outside caller's identity
// from (DESIGN §10). The identity scopes delivery IDs: the owner's dedupe
// window and kept answers are keyed by (caller, ID), so a caller that
// sends first under another caller's ID gets its own handling, never the
// other's delivery or answer.
type CallerIdentity int

const (
	// CallerFromInbox (single account, the weaker mode): the caller is
	// the inbox prefix of its reply subject — the reply without the two
	// tokens nats.go appends (<prefix>.<connection>.<request>), e.g.
	// "_INBOX.alice" for a user whose permissions allow only
	// _INBOX.alice.>. Callers that share a prefix share an ID scope; a
	// caller can name another's prefix as its reply (NATS checks no
	// permission on reply subjects) and so act blind in its scope. A
	// delivery without a reply is in the "anon" scope.
	CallerFromInbox CallerIdentity = iota
	// CallerFromRequestInfo (tenants in their own accounts, production):
	// the caller is the account and user the NATS server stamps in
	// Nats-Request-Info when the request crosses the mesh account's
	// service import (export with share: true); the server replaces any
	// such header the client set, and answers through a reply subject of
	// its own making (_R_.…). The header is believed only on a request
	// with such a reply; any other (a member of the mesh account itself:
	// nodes, operators — who can write the header themselves) falls back
	// to its inbox prefix, and a delivery without a reply is "anon".
	CallerFromRequestInfo
)

// serviceReplyPrefix begins the reply subjects a NATS server makes for a
// request that crossed a service import: only such a request's
// Nats-Request-Info is the server's (a member of the mesh account itself
// can write the header, but then its reply is its own inbox; naming a
// _R_ reply instead, it never receives the answer).
const serviceReplyPrefix = "_R_."

// HeaderRequestInfo is the header a NATS server stamps on a request that
// crosses a service import whose export shares requestor info
// (nats-server's ClientInfoHdr).
const HeaderRequestInfo = "Nats-Request-Info"

// callerOf returns the identity of the outside caller of ingress message m
// (CallerIdentity), as a hub.HeaderCaller value: "acc:<account>:<user>"
// or "inbox:<prefix>" or "anon", with account, user and prefix encoded as
// subject tokens (printable, no spaces).
//
// A request carrying Nats-Request-Info more than once is refused (ok
// false): the server writes one value, so a second was smuggled past its
// replacement of the client's own (a bare-LF header line, which the server
// does not read as a line but nats.go does).
func (n *Node) callerOf(m *nats.Msg) (caller string, ok bool) {
	if len(m.Header.Values(HeaderRequestInfo)) > 1 {
		return "", false
	}
	if n.cfg.CallerIdentity == CallerFromRequestInfo && strings.HasPrefix(m.Reply, serviceReplyPrefix) {
		if v := m.Header.Get(HeaderRequestInfo); v != "" {
			var ci struct {
				Account string `json:"acc"`
				User    string `json:"user"`
			}
			if json.Unmarshal([]byte(v), &ci) == nil && ci.Account != "" {
				return "acc:" + subjects.EncodeToken(ci.Account) + ":" + subjects.EncodeToken(ci.User), true
			}
		}
	}
	for _, p := range n.cfg.ClientInboxes {
		// A user's own prefix names it, whatever nats.go appended
		// (replyRule refused any other shape under it).
		if len(m.Reply) > len(p) && strings.HasPrefix(m.Reply, p) && m.Reply[len(p)] == '.' {
			return inboxCaller(p + ".c.r"), true
		}
	}
	return inboxCaller(m.Reply), true
}

// inboxCaller is the CallerFromInbox identity of a reply subject.
func inboxCaller(reply string) string {
	if reply == "" {
		return "anon"
	}
	prefix := reply
	if i := strings.LastIndexByte(prefix, '.'); i > 0 {
		if j := strings.LastIndexByte(prefix[:i], '.'); j > 0 {
			prefix = prefix[:j] // <prefix>.<connection>.<request>
		} else {
			prefix = prefix[:i] // <prefix>.<request> (old-style requests)
		}
	}
	var b strings.Builder
	b.WriteString("inbox:")
	for i := 0; i < len(prefix) && b.Len() < maxInboxCaller; i++ {
		// SafeReply let through no space or control byte; bytes beyond
		// ASCII are written =HH, so the value stays printable ASCII
		// (hub.ValidateCaller).
		if c := prefix[i]; c > 0x7e || c == '=' {
			fmt.Fprintf(&b, "=%02X", c)
		} else {
			b.WriteByte(c)
		}
	}
	return b.String()
}

// maxInboxCaller bounds an inbox identity below hub.MaxCallerLen: a longer
// prefix is cut (still one caller's own prefix, shared only with callers
// whose prefixes agree that far).
const maxInboxCaller = 400

// replyRule reports why the ingress refuses reply, a reply subject that
// passed subjects.Prefix.SafeReply, or "" if it may answer there (issue 22,
// SECURITY.md "Reply rules"):
//
//   - under the nodes' own inbox prefix (subjects.Prefix.NodeInbox): the
//     acceptance replies of node-to-node deliveries travel there, and no
//     outside caller has a reply of its own under it;
//   - under one of NodeConfig.ClientInboxes (the users' own inbox
//     prefixes) without being that prefix's own reply shape — the prefix
//     plus one or two tokens, as nats.go makes them: a caller naming
//     "_INBOX.bob.x.y.z" would be the caller "_INBOX.bob.x" (a scope of its
//     own) while its answers land in bob's inbox.
//
// In CallerFromInbox mode the caller is its reply's inbox prefix: a reply
// that names exactly another user's prefix makes the requester that
// caller, blind (it never reads the answer), which the node cannot tell
// from the user itself; only tenants in their own accounts
// (CallerFromRequestInfo, server-made _R_ replies) rule that out.
func (n *Node) replyRule(reply string) string {
	ni := n.prefix.NodeInbox()
	if reply == ni || strings.HasPrefix(reply, ni) && reply[len(ni)] == '.' {
		return "node-inbox"
	}
	for _, p := range n.cfg.ClientInboxes {
		if len(reply) <= len(p) || !strings.HasPrefix(reply, p) || reply[len(p)] != '.' {
			continue
		}
		if tail := reply[len(p)+1:]; strings.Count(tail, ".") > 1 {
			return "foreign-inbox"
		}
	}
	return ""
}
