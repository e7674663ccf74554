package membership

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// UserInfoSubject is the server's own "who am I" service, which every
// account of a server with a system account may ask: a node asks it for
// the account it runs in, whose disconnect advisory it then subscribes to.
const UserInfoSubject = "$SYS.REQ.USER.INFO"

// ErrNoAccountInfo: the server did not say which account a connection is in
// (no system account, no permission to ask, or an answer without one).
var ErrNoAccountInfo = errors.New("membership: the NATS server did not say which account this connection is in")

// userInfoTimeout bounds AccountAdvisorySubject's request when ctx has no
// earlier deadline.
const userInfoTimeout = 2 * time.Second

// AccountAdvisorySubject asks the server which account nc's user is in
// (UserInfoSubject, $SYS.REQ.USER.INFO, which every account of a
// server with a system account may ask) and returns that account's
// client-disconnect advisory, $SYS.ACCOUNT.<account>.DISCONNECT: the
// subject the account imports it under (docs/operations.md §1), and the one
// the node profile may subscribe to. A node subscribing to the wildcard
// $SYS.ACCOUNT.*.DISCONNECT instead would be refused by the node profile
// (a permission violation at start and after every reconnect) and detect
// departures by the registry TTL only.
//
// It blocks for one request, at most 2 s or until ctx ends. Errors wrap
// ErrNoAccountInfo (with the request's own error, e.g.
// nats.ErrNoResponders without a system account, nats.ErrTimeout when the
// user may not ask).
func AccountAdvisorySubject(ctx context.Context, nc *nats.Conn) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, userInfoTimeout)
	defer cancel()
	msg, err := nc.RequestWithContext(ctx, UserInfoSubject, nil)
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrNoAccountInfo, err)
	}
	var r struct {
		Data *struct {
			Account string `json:"account"`
		} `json:"data"`
		Error *struct {
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(msg.Data, &r); err != nil {
		return "", fmt.Errorf("%w: %w", ErrNoAccountInfo, err)
	}
	if r.Error != nil {
		return "", fmt.Errorf("%w: %s", ErrNoAccountInfo, r.Error.Description)
	}
	if r.Data == nil || r.Data.Account == "" || strings.ContainsAny(r.Data.Account, ".*> \t\r\n") {
		return "", ErrNoAccountInfo
	}
	return "$SYS.ACCOUNT." + r.Data.Account + ".DISCONNECT", nil
}

// ErrAdvisoriesSilent: ProbeAdvisories saw no disconnect advisory for its
// probe connection's disconnect before its context ended. The account does
// not receive them on that subject — the import from the system account is
// missing, the server has no system account, or the user may not subscribe
// to the subject — so a departed node is detected by the registry TTL and
// the fencing delay, not within milliseconds (docs/operations.md, "Prompt
// failure").
var ErrAdvisoriesSilent = errors.New("membership: no disconnect advisory arrived for a probe connection's disconnect")

// ProbeAdvisories checks that disconnect advisories reach nc on subject
// (the one the node's membership listens on): it subscribes, opens a probe
// connection with dial (the node's own credentials, so the probe is in the
// node's account), closes it, and waits for the advisory naming the probe
// (its server ID and client ID). A subscription the server refuses, a
// missing import and a server without a system account look alike from
// the client: each is ErrAdvisoriesSilent once ctx ends.
//
// It blocks until the advisory arrives or ctx ends (callers bound it: 5 s
// is ample on a healthy server, where the advisory follows the close by
// milliseconds). Errors: dial's, the subscription's, or
// ErrAdvisoriesSilent. Safe for concurrent use; it leaves nothing behind.
func ProbeAdvisories(ctx context.Context, nc *nats.Conn, subject string, dial func() (*nats.Conn, error)) error {
	ch := make(chan *nats.Msg, 64)
	sub, err := nc.ChanSubscribe(subject, ch)
	if err != nil {
		return fmt.Errorf("membership: advisory probe: subscribe to %s: %w", subject, err)
	}
	defer sub.Unsubscribe()
	// The subscription is in place on the server before the probe closes.
	if err := nc.FlushWithContext(ctx); err != nil {
		return fmt.Errorf("membership: advisory probe: %w", err)
	}
	probe, err := dial()
	if err != nil {
		return fmt.Errorf("membership: advisory probe: connect: %w", err)
	}
	server, client := probe.ConnectedServerId(), uint64(0)
	if id, err := probe.GetClientID(); err == nil {
		client = id
	}
	probe.Close()
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w on %s within the probe's wait (%w)", ErrAdvisoriesSilent, subject, ctx.Err())
		case m := <-ch:
			var a disconnectAdvisory
			if json.Unmarshal(m.Data, &a) == nil && a.Server.ID == server && a.Client.ID == client {
				return nil
			}
		}
	}
}
