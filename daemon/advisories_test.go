package daemon

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/natsmesh/natsmesh/internal/natstest"
)

// advisoriesGauge reads natsmesh_disconnect_advisories from a node's
// /metrics (ok false while it is absent).
func advisoriesGauge(t *testing.T, info Info) (float64, bool) {
	t.Helper()
	_, body := scrape(t, info.HTTPAddr, "")
	mf := parseMetrics(t, body)["natsmesh_disconnect_advisories"]
	if mf == nil || len(mf.GetMetric()) != 1 {
		return 0, false
	}
	return mf.GetMetric()[0].GetGauge().GetValue(), true
}

// TestAdvisorySelfCheck (issue 24): meshd checks once, after joining, that
// the server's client-disconnect advisories reach it — a probe connection
// of its own, closed, must be reported — and says which: on the embedded
// server (whose accounts import them) the gauge reads 1 and the log says
// verified; on an external server whose account lacks the import (the
// subscription is allowed and silent, operations.md §1) it reads 0 and a
// warning names the fallback to the registry TTL, instead of a log line
// that suggests prompt failure works.
func TestAdvisorySelfCheck(t *testing.T) {
	t.Parallel()
	t.Run("embedded", func(t *testing.T) {
		var logs natstest.SyncBuffer
		info := runNode(t, "adv-embedded", func(c *Config) { c.Logger = slog.New(slog.NewJSONHandler(&logs, nil)) })
		natstest.Eventually(t, 20*time.Second, func() bool { v, ok := advisoriesGauge(t, info); return ok && v == 1 }, "the gauge reads 1 (verified)")
		if !strings.Contains(logs.String(), "disconnect advisories verified") {
			t.Errorf("no verified line in the log:\n%s", logs.String())
		}
	})
	t.Run("external without the import", func(t *testing.T) {
		s := natstest.RunServer(t, natstest.WithConfig(`accounts {
  SYS {}
  MESH { jetstream: enabled, users: [{user: mesh}] }
}
system_account: SYS
no_auth_user: mesh
`))
		var logs natstest.SyncBuffer
		info := runNode(t, "adv-silent", func(c *Config) {
			c.Listen, c.DataDir, c.NATSURL = "", "", s.ClientURL()
			c.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
		})
		if v, ok := advisoriesGauge(t, info); !ok || v != -1 {
			t.Errorf("before the check: %v (present %v), want -1 (not known)", v, ok)
		}
		natstest.Eventually(t, AdvisoryProbeWait+20*time.Second, func() bool { v, ok := advisoriesGauge(t, info); return ok && v == 0 }, "the gauge reads 0 (silent)")
		l := logs.String()
		if !strings.Contains(l, "disconnect advisories do not arrive") || !strings.Contains(l, `"subject":"$SYS.ACCOUNT.MESH.DISCONNECT"`) {
			t.Errorf("no warning naming the subject:\n%s", l)
		}
		if strings.Contains(l, "disconnect advisories verified") {
			t.Errorf("claims verified advisories without the import:\n%s", l)
		}
	})
}
