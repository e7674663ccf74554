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
