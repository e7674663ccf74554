package profiles_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/mesh"
	"github.com/natsmesh/natsmesh/mesh/membership"
	"github.com/natsmesh/natsmesh/profiles"
	"github.com/natsmesh/natsmesh/subjects"
)

// secured is a real in-process server whose account MESH holds one nkey
// user per profile, plus "open": a password user without permissions, as
// every user of an account without the profiles is (today's default).
type secured struct {
	s    *server.Server
	m    profiles.Mesh
	keys map[string]nkeys.KeyPair
	// caller is the nodes' caller identity mode: CallerFromRequestInfo
	// for the multi-account mode.
	caller mesh.CallerIdentity
}

// Tenant accounts of newMultiSecured and the names of their client users'
// keys: "client" in ALICE, "bob" in BOB.
const aliceAccount, bobAccount, bobUser = "ALICE", "BOB", "bob"

// newMultiSecured is newSecured in the multi-account (production) mode of
// profiles.MultiAccountConf: nkey users with the node and operator
// profiles in MESH, a client-profile user in each of the tenant accounts
// ALICE ("client") and BOB ("bob"); nodes take the caller identity from
// Nats-Request-Info.
func newMultiSecured(t testing.TB) *secured {
	t.Helper()
	e := &secured{m: profiles.Mesh{}, keys: map[string]nkeys.KeyPair{}, caller: mesh.CallerFromRequestInfo}
	user := func(name string, p profiles.Permissions) profiles.User {
		kp, err := nkeys.CreateUser()
		if err != nil {
			t.Fatal(err)
		}
		pub, _ := kp.PublicKey()
		e.keys[name] = kp
		return profiles.User{NKey: pub, Profile: p}
	}
	conf, err := profiles.MultiAccountConf(e.m,
		[]profiles.User{user("node", profiles.Node(e.m)), user("operator", profiles.Operator(e.m))},
		[]profiles.Tenant{
			{Account: aliceAccount, Users: []profiles.User{user("client", profiles.Client(e.m))}},
			{Account: bobAccount, Users: []profiles.User{user(bobUser, profiles.Client(e.m))}},
		})
	if err != nil {
		t.Fatal(err)
	}
	e.s = natstest.RunServer(t, natstest.WithConfig("ping_interval: \"500ms\"\nping_max: 2\n"+conf))
	return e
}

const openUser, openPassword = "open", "open-secret"

// snoopUser may publish and subscribe to <prefix>.> but not read the
// nodes' inbox: it sees every delivery and may publish answers, but never
// sees an acceptance reply.
const snoopUser, snoopPassword = "snoop", "snoop-secret"

func newSecured(t *testing.T, extra ...profiles.User) *secured {
	t.Helper()
	e := &secured{m: profiles.Mesh{}, keys: map[string]nkeys.KeyPair{}}
	var users []profiles.User
	for _, p := range profiles.All(e.m) {
		kp, err := nkeys.CreateUser()
		if err != nil {
			t.Fatal(err)
		}
		pub, _ := kp.PublicKey()
		e.keys[p.Name] = kp
		users = append(users, profiles.User{NKey: pub, Profile: p})
	}
	users = append(users, profiles.User{User: openUser, Password: openPassword, Profile: profiles.Permissions{
		Name: "open (no profile)", Publish: []string{">"}, Subscribe: []string{">"},
	}})
	users = append(users, profiles.User{User: snoopUser, Password: snoopPassword, Profile: profiles.Permissions{
		Name: "snoop", Publish: []string{string(subjects.DefaultPrefix) + ".>"}, Subscribe: []string{string(subjects.DefaultPrefix) + ".>", "_INBOX.>"},
	}})
	users = append(users, extra...)
	conf, err := profiles.AccountsConf(e.m, users)
	if err != nil {
		t.Fatal(err)
	}
	e.s = natstest.RunServer(t, natstest.WithConfig("ping_interval: \"500ms\"\nping_max: 2\n"+conf))
	return e
}

// auth returns the connect option of a profile's user ("open" for the
// password user).
func (e *secured) auth(t testing.TB, profile string) nats.Option {
	t.Helper()
	switch profile {
	case openUser:
		return nats.UserInfo(openUser, openPassword)
	case snoopUser:
		return nats.UserInfo(snoopUser, snoopPassword)
	}
	kp := e.keys[profile]
	if kp == nil {
		t.Fatalf("no user for profile %q", profile)
	}
	pub, _ := kp.PublicKey()
	return nats.Nkey(pub, kp.Sign)
}

// conn connects as profile; an async error (a permission violation) fails
// the test.
func (e *secured) conn(t testing.TB, profile string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	return natstest.Connect(t, e.s, append([]nats.Option{e.auth(t, profile)}, opts...)...)
}

// attacker connects as profile and collects the asynchronous errors the
// server sends (permission violations) instead of failing on them.
type attacker struct {
	nc   *nats.Conn
	mu   sync.Mutex
	errs []error
}

func (e *secured) attacker(t *testing.T, profile string, opts ...nats.Option) *attacker {
	t.Helper()
	a := &attacker{}
	all := append([]nats.Option{e.auth(t, profile), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		a.mu.Lock()
		a.errs = append(a.errs, err)
		a.mu.Unlock()
	})}, opts...)
	nc, err := nats.Connect(e.s.ClientURL(), all...)
	if err != nil {
		t.Fatalf("attacker connect: %v", err)
	}
	t.Cleanup(nc.Close)
	a.nc = nc
	return a
}

// refused waits until the server reported a permission violation naming
// subject.
func (a *attacker) refused(t *testing.T, subject string) {
	t.Helper()
	natstest.Eventually(t, 5*time.Second, func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		for _, err := range a.errs {
			if errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), subject) {
				return true
			}
		}
		return false
	}, "no permission violation for %q", subject)
}

// node starts a mesh node with membership on a node-profile connection
// (or another profile's), hosting kind "echo" (responds with the payload)
// and kind "rec" (counts handled deliveries).
type testNode struct {
	*mesh.Node
	nc       *nats.Conn
	drains   chan struct{}
	fatal    chan error
	lates    chan mesh.LateVerdict
	events   chan membership.Event
	gate     chan struct{} // kind "gate" handles one delivery per value received
	handledN func(id string) int
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func (e *secured) node(t testing.TB, name, profile string, opts ...mesh.Option) *testNode {
	t.Helper()
	nc := e.conn(t, profile, nats.Name(membership.ConnNamePrefix+name), nats.CustomInboxPrefix(profiles.NodeInboxPrefix(e.m.Prefix)))
	tn := &testNode{nc: nc, drains: make(chan struct{}, 8), fatal: make(chan error, 1), lates: make(chan mesh.LateVerdict, 64), events: make(chan membership.Event, 64), gate: make(chan struct{})}
	var mu sync.Mutex
	count := map[string]int{}
	tn.handledN = func(id string) int { mu.Lock(); defer mu.Unlock(); return count[id] }
	opts = append([]mesh.Option{mesh.WithLateVerdicts(func(v mesh.LateVerdict) { tn.lates <- v })}, opts...)
	n, err := mesh.NewNode(mesh.NodeConfig{
		Conn: nc, Name: name, Logger: quiet(), CallerIdentity: e.caller,
		Membership:     &mesh.MembershipConfig{AdvisorySubject: e.m.AdvisorySubject()},
		OnDrainRequest: func() { tn.drains <- struct{}{} },
		OnMembershipEvent: func(ev membership.Event) {
			select {
			case tn.events <- ev:
			default:
			}
		},
		OnFatal: func(err error) {
			select {
			case tn.fatal <- err:
			default:
			}
		},
	}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	tn.Node = n
	handler := func(_ context.Context, addr subjects.Address) (hub.Hub, error) {
		return hub.HandlerFunc(func(_ context.Context, d *hub.Delivery) error {
			mu.Lock()
			count[d.ID]++
			mu.Unlock()
			return d.Respond(d.Payload)
		}), nil
	}
	for _, k := range []string{"echo", "rec"} {
		if err := n.Register(k, handler); err != nil {
			t.Fatal(err)
		}
	}
	gated := func(ctx context.Context, addr subjects.Address) (hub.Hub, error) {
		return hub.HandlerFunc(func(ctx context.Context, d *hub.Delivery) error {
			select {
			case <-tn.gate:
			case <-ctx.Done():
				return ctx.Err()
			}
			return d.Respond([]byte("real:" + string(d.Payload)))
		}), nil
	}
	if err := n.Register("gate", gated); err != nil {
		t.Fatal(err)
	}
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	return tn
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}
