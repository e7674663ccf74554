package membership_test

import (
	"errors"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/mesh/membership"
)

// AccountAdvisorySubject names the advisory of the account the user is in
// (the subject the node profile allows, issue 22), for each account of a
// server; a user that may not ask gets ErrNoAccountInfo, not a hang.
func TestAccountAdvisorySubject(t *testing.T) {
	s := natstest.RunServer(t, natstest.WithConfig(`accounts {
  SYS {}
  APP { users: [{user: app, password: a}] }
  OTHER { users: [{user: other, password: o}, {user: mute, password: m, permissions: {publish: {deny: [">"]}}}] }
}
system_account: SYS
`))
	for user, want := range map[string]string{"app": "$SYS.ACCOUNT.APP.DISCONNECT", "other": "$SYS.ACCOUNT.OTHER.DISCONNECT"} {
		nc := natstest.Connect(t, s, nats.UserInfo(user, map[string]string{"app": "a", "other": "o"}[user]))
		got, err := membership.AccountAdvisorySubject(t.Context(), nc)
		if err != nil || got != want {
			t.Errorf("%s: %q, %v; want %q", user, got, err, want)
		}
	}
	nc, err := nats.Connect(s.ClientURL(), nats.UserInfo("mute", "m"), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if _, err := membership.AccountAdvisorySubject(t.Context(), nc); !errors.Is(err, membership.ErrNoAccountInfo) {
		t.Errorf("a user that may not ask: %v, want ErrNoAccountInfo", err)
	}
}
