package membership_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/mesh/membership"
)

// AccountAdvisorySubject names the advisory of the account the user is in
// (the subject the node profile allows, issue 22), for each account of a
// server; a user that may not ask gets ErrNoAccountInfo, not a hang.
func TestAccountAdvisorySubject(t *testing.T) {
	t.Parallel()
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

// ProbeAdvisories: with the docs' export and import (operations.md §1) the
// probe connection's disconnect advisory arrives; without the import the
// subscription is accepted and silent, and the probe says so
// (ErrAdvisoriesSilent) once its wait ends instead of claiming prompt
// failure; a server without a system account is silent the same way.
func TestProbeAdvisories(t *testing.T) {
	t.Parallel()
	withImport := `accounts {
  SYS { exports: [{stream: "$SYS.ACCOUNT.MESH.DISCONNECT", accounts: [MESH]}] }
  MESH { users: [{user: mesh, password: m}], imports: [{stream: {account: SYS, subject: "$SYS.ACCOUNT.MESH.DISCONNECT"}}] }
}
system_account: SYS
`
	withoutImport := `accounts {
  SYS {}
  MESH { users: [{user: mesh, password: m}] }
}
system_account: SYS
`
	noSystem := `accounts {
  MESH { users: [{user: mesh, password: m}] }
}
`
	for _, tc := range []struct {
		name, conf string
		flows      bool
	}{{"import", withImport, true}, {"no import", withoutImport, false}, {"no system account", noSystem, false}} {
		t.Run(tc.name, func(t *testing.T) {
			s := natstest.RunServer(t, natstest.WithConfig(tc.conf))
			user := nats.UserInfo("mesh", "m")
			nc := natstest.Connect(t, s, user)
			reps, wait := 3, 5*time.Second
			if !tc.flows {
				reps, wait = 1, 500*time.Millisecond // silence is only proven by waiting
			}
			for rep := range reps {
				ctx, cancel := context.WithTimeout(t.Context(), wait)
				start := time.Now()
				err := membership.ProbeAdvisories(ctx, nc, "$SYS.ACCOUNT.MESH.DISCONNECT", func() (*nats.Conn, error) {
					return nats.Connect(s.ClientURL(), user)
				})
				cancel()
				if tc.flows && err != nil {
					t.Fatalf("rep %d: %v; want the advisory", rep, err)
				}
				if !tc.flows && !errors.Is(err, membership.ErrAdvisoriesSilent) {
					t.Fatalf("rep %d: %v; want ErrAdvisoriesSilent", rep, err)
				}
				t.Logf("rep %d: %v after %v", rep, err, time.Since(start))
			}
			if n := nc.NumSubscriptions(); n != 0 {
				t.Errorf("%d subscriptions left behind", n)
			}
		})
	}
}
