package daemon

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/profiles"
)

// TestWrongProfileNamesTheNodeProfile: meshd connecting as a user of
// another profile (client, operator) is refused the JetStream API; it says
// at once that it needs the node profile's user — not, ten seconds later,
// that JetStream did not answer.
func TestWrongProfileNamesTheNodeProfile(t *testing.T) {
	t.Parallel()
	m := profiles.Mesh{}
	conf, err := profiles.AccountsConf(m, []profiles.User{
		{User: "node", Password: "np", Profile: profiles.Node(m)},
		{User: "client", Password: "cp", Profile: profiles.Client(m)},
		{User: "operator", Password: "op", Profile: profiles.Operator(m)},
	})
	if err != nil {
		t.Fatal(err)
	}
	s := natstest.RunServer(t, natstest.WithConfig(conf))
	for _, u := range []struct{ user, pass string }{{"client", "cp"}, {"operator", "op"}} {
		t.Run(u.user, func(t *testing.T) {
			began := time.Now()
			err := Run(context.Background(), Config{
				Name: "wrong", NATSURL: s.ClientURL(), User: u.user, Password: u.pass, HTTP: "",
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
			})
			if !errors.Is(err, ErrNotPermitted) || errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "node profile") {
				t.Fatalf("as %s: %v, want ErrNotPermitted naming the node profile", u.user, err)
			}
			if d := time.Since(began); d > 5*time.Second {
				t.Errorf("as %s: refused after %v, want at once", u.user, d)
			}
		})
	}
}
