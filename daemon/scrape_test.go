package daemon

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/buildinfo"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// runNode runs a meshd node (daemon.Run) with an embedded server and
// membership, its HTTP server on a free port, until the test ends.
func runNode(t *testing.T, name string, mod func(*Config)) Info {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	infoCh := make(chan Info, 1)
	done := make(chan error, 1)
	cfg := Config{
		Name: name, Listen: "127.0.0.1:0", DataDir: t.TempDir(), HTTP: "127.0.0.1:0",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Ready:  func(i Info) { infoCh <- i },
	}
	if mod != nil {
		mod(&cfg)
	}
	go func() { done <- Run(ctx, cfg) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("drain: %v", err)
		}
	})
	select {
	case info := <-infoCh:
		return info
	case err := <-done:
		t.Fatalf("run: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("node not ready")
	}
	return Info{}
}

func scrape(t *testing.T, addr, accept string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, body
}

// parseMetrics reads the text exposition format.
func parseMetrics(t *testing.T, body []byte) map[string]*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return mfs
}

// wantMetrics are the natsmesh metrics of issue 13 item 6 (and the older
// ones a dashboard reads), by type. Every one is present on a node that
// has delivered, refused and handled something.
var wantMetrics = map[string]dto.MetricType{
	"natsmesh_delivery_duration_seconds":       dto.MetricType_HISTOGRAM,
	"natsmesh_hub_turn_duration_seconds":       dto.MetricType_HISTOGRAM,
	"natsmesh_deliveries_total":                dto.MetricType_COUNTER,
	"natsmesh_hub_refusals_total":              dto.MetricType_COUNTER,
	"natsmesh_hub_late_verdicts_total":         dto.MetricType_COUNTER,
	"natsmesh_late_verdicts_received_total":    dto.MetricType_COUNTER,
	"natsmesh_nats_reconnects_total":           dto.MetricType_COUNTER,
	"natsmesh_nats_connected":                  dto.MetricType_GAUGE,
	"natsmesh_nats_server_info":                dto.MetricType_GAUGE,
	"natsmesh_node_events_total":               dto.MetricType_COUNTER,
	"natsmesh_build_info":                      dto.MetricType_GAUGE,
	"natsmesh_node_info":                       dto.MetricType_GAUGE,
	"natsmesh_hub_accepted_total":              dto.MetricType_COUNTER,
	"natsmesh_legs_in_flight":                  dto.MetricType_GAUGE,
	"natsmesh_retries_total":                   dto.MetricType_COUNTER,
	"natsmesh_membership_events_total":         dto.MetricType_COUNTER,
	"natsmesh_departure_detection_seconds":     dto.MetricType_HISTOGRAM,
	"natsmesh_activations":                     dto.MetricType_GAUGE,
	"natsmesh_ingress_total":                   dto.MetricType_COUNTER,
	"natsmesh_ingress_inbox_refused_total":     dto.MetricType_COUNTER,
	"natsmesh_ingress_share_refused_total":     dto.MetricType_COUNTER,
	"natsmesh_ingress_slots_held":              dto.MetricType_GAUGE,
	"natsmesh_ingress_caller_deliveries_total": dto.MetricType_COUNTER,
	"natsmesh_reminder_fires_total":            dto.MetricType_COUNTER,
	"natsmesh_reminder_fires_in_flight":        dto.MetricType_GAUGE,
	"natsmesh_disconnect_advisories":           dto.MetricType_GAUGE,
}

// TestMetricsScrape scrapes a running node after requests through the
// ingress and a refused raw delivery: every metric of the issue is there
// with its type and help, the labels carry the facts (verdict, reason,
// build, identity, server), promlint (promtool's rules) finds nothing, and
// a scraper asking for OpenMetrics gets it.
func TestMetricsScrape(t *testing.T) {
	t.Parallel()
	info := runNode(t, "scraped", nil)
	nc := natstest.ConnectURL(t, info.NATSURL)
	for i := range 5 {
		m := &nats.Msg{Subject: subjects.DefaultPrefix.Ingress("echo/m", ""), Header: nats.Header{}, Data: []byte("hi")}
		m.Header.Set(hub.HeaderExpectResponse, "true")
		r, err := nc.RequestMsg(m, 20*time.Second)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if _, verr := verdict.Decode(r.Header); verr != nil {
			t.Fatalf("request %d: %v", i, verr)
		}
	}
	// A delivery without an ID, straight to the node: refused invalid-id.
	raw := &nats.Msg{Subject: subjects.DefaultPrefix.Delivery(info.Node, "echo/m", ""), Header: nats.Header{}}
	r, err := nc.RequestMsg(raw, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, verr := verdict.Decode(r.Header); verdict.ReasonOf(verr) != verdict.ReasonInvalidID {
		t.Fatalf("raw delivery: %v", verr)
	}

	// A turn is counted when its handler returns, just after the
	// response went out: wait for the fifth.
	var resp *http.Response
	var body []byte
	natstest.Eventually(t, 20*time.Second, func() bool {
		resp, body = scrape(t, info.HTTPAddr, "")
		for _, m := range parseMetrics(t, body)["natsmesh_hub_turn_duration_seconds"].GetMetric() {
			return m.GetHistogram().GetSampleCount() == 5
		}
		return false
	}, "five turns counted")
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Fatalf("content type %q", ct)
	}
	problems, err := promlint.New(strings.NewReader(string(body))).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
	mfs := parseMetrics(t, body)
	for name, typ := range wantMetrics {
		mf := mfs[name]
		if mf == nil {
			t.Errorf("%s missing", name)
			continue
		}
		if mf.GetType() != typ {
			t.Errorf("%s: type %v, want %v", name, mf.GetType(), typ)
		}
		if mf.GetHelp() == "" {
			t.Errorf("%s: no help", name)
		}
	}
	for name, mf := range mfs {
		if strings.HasPrefix(name, "natsmesh_") && mf.GetHelp() == "" {
			t.Errorf("%s: no help", name)
		}
	}

	// The facts behind the labels.
	label := func(m *dto.Metric, name string) string {
		for _, l := range m.GetLabel() {
			if l.GetName() == name {
				return l.GetValue()
			}
		}
		return ""
	}
	find := func(name, lname, lvalue string) *dto.Metric {
		for _, m := range mfs[name].GetMetric() {
			if lname == "" || label(m, lname) == lvalue {
				return m
			}
		}
		t.Fatalf("%s{%s=%q} missing", name, lname, lvalue)
		return nil
	}
	if h := find("natsmesh_delivery_duration_seconds", "verdict", "Accepted").GetHistogram(); h.GetSampleCount() != 5 || h.GetSampleSum() <= 0 {
		t.Errorf("delivery latency {verdict=Accepted}: count %d sum %v, want 5 requests", h.GetSampleCount(), h.GetSampleSum())
	}
	if h := find("natsmesh_hub_turn_duration_seconds", "", "").GetHistogram(); h.GetSampleCount() != 5 {
		t.Errorf("turns: %d, want 5", h.GetSampleCount())
	}
	if v := find("natsmesh_hub_refusals_total", "reason", "invalid-id").GetCounter().GetValue(); v != 1 {
		t.Errorf("refusals{reason=invalid-id} = %v", v)
	}
	if v := find("natsmesh_deliveries_total", "verdict", "Accepted").GetCounter().GetValue(); v != 5 {
		t.Errorf("deliveries{verdict=Accepted} = %v", v)
	}
	for _, ev := range []string{"fenced", "rejoined", "superseded"} {
		if v := find("natsmesh_node_events_total", "event", ev).GetCounter().GetValue(); v != 0 {
			t.Errorf("node events{event=%s} = %v", ev, v)
		}
	}
	b := find("natsmesh_build_info", "", "")
	if label(b, "nats_go") != nats.Version || label(b, "nats_server") == "" || !strings.HasPrefix(label(b, "goversion"), "go") || label(b, "version") == "" || label(b, "release") != buildinfo.Release {
		t.Errorf("build info labels %v", b.GetLabel())
	}
	n := find("natsmesh_node_info", "", "")
	if label(n, "node") != info.Node.String() || label(n, "name") != "scraped" || label(n, "kinds") != strings.Join(info.Kinds, ",") || label(n, "prefix") != string(subjects.DefaultPrefix) {
		t.Errorf("node info labels %v (node %s)", n.GetLabel(), info.Node)
	}
	if s := find("natsmesh_nats_server_info", "", ""); label(s, "url") != info.NATSURL || label(s, "server_name") != "meshd-scraped" {
		t.Errorf("server info labels %v, want url %s", s.GetLabel(), info.NATSURL)
	}
	if v := find("natsmesh_nats_connected", "", "").GetGauge().GetValue(); v != 1 {
		t.Errorf("connected = %v", v)
	}

	checkDashboard(t, mfs)

	// OpenMetrics when the scraper asks for it.
	resp, body = scrape(t, info.HTTPAddr, "application/openmetrics-text; version=1.0.0; charset=utf-8")
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/openmetrics-text") {
		t.Fatalf("OpenMetrics asked, content type %q", ct)
	}
	if !strings.HasSuffix(string(body), "# EOF\n") || !strings.Contains(string(body), "# TYPE natsmesh_build_info gauge") {
		t.Fatalf("not an OpenMetrics exposition:\n%.400s", body)
	}
}

// dashboardFile is the Grafana dashboard shipped in deploy/.
const dashboardFile = "../deploy/grafana/natsmesh.json"

var metricName = regexp.MustCompile(`\bnatsmesh_[a-z_]+`)

// checkDashboard: every query of the dashboard (panel targets and template
// variables) names at least one metric, and each metric it names is in
// the scrape mfs (a histogram by its _bucket, _sum or _count series).
func checkDashboard(t *testing.T, mfs map[string]*dto.MetricFamily) {
	t.Helper()
	raw, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var dash any
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	var queries []string
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				if s, ok := x.(string); ok && (k == "expr" || (k == "query" && v["type"] == "query")) {
					queries = append(queries, s)
				}
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	walk(dash)
	if len(queries) < 10 {
		t.Fatalf("%s: %d queries found", dashboardFile, len(queries))
	}
	for _, q := range queries {
		names := metricName.FindAllString(q, -1)
		if len(names) == 0 {
			t.Errorf("dashboard query %q names no natsmesh metric", q)
		}
		for _, n := range names {
			if mfs[n] != nil {
				continue
			}
			base := n
			for _, suf := range []string{"_bucket", "_sum", "_count"} {
				base = strings.TrimSuffix(base, suf)
			}
			if mf := mfs[base]; mf == nil || (base != n && mf.GetType() != dto.MetricType_HISTOGRAM) {
				t.Errorf("dashboard query %q: %s is not in /metrics", q, n)
			}
		}
	}
}
