package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// otlpSink collects the spans an OTLP exporter sends, with the service name
// of their resource.
type otlpSink struct {
	collectortrace.UnimplementedTraceServiceServer
	mu    sync.Mutex
	spans map[string]string // span name → service.name, for one trace ID
	trace []byte
}

func (s *otlpSink) add(req *collectortrace.ExportTraceServiceRequest) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		svc := ""
		for _, a := range rs.GetResource().GetAttributes() {
			if a.GetKey() == "service.name" {
				svc = a.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				if string(sp.GetTraceId()) == string(s.trace) {
					s.spans[sp.GetName()] = svc
				}
			}
		}
	}
}

func (s *otlpSink) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	s.add(req)
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

func (s *otlpSink) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var req collectortrace.ExportTraceServiceRequest
	if r.URL.Path != "/v1/traces" || proto.Unmarshal(body, &req) != nil {
		http.Error(w, "bad export", http.StatusBadRequest)
		return
	}
	s.add(&req)
	out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

func (s *otlpSink) got() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]string{}
	for k, v := range s.spans {
		out[k] = v
	}
	return out
}

// TestTracingFromEnv: meshd's tracing is configured by the standard OTEL_*
// environment and exports over OTLP with both protocols (grpc,
// http/protobuf) to a receiver: an outside client's request through the
// ingress arrives as one trace with the ingress, request, intake and turn
// spans under OTEL_SERVICE_NAME.
func TestTracingFromEnv(t *testing.T) {
	for _, protocol := range []string{"grpc", "http/protobuf"} {
		t.Run(protocol, func(t *testing.T) {
			tid := []byte{0x0a, 0xf7, 0x65, 0x19, 0x16, 0xcd, 0x43, 0xdd, 0x84, 0x48, 0xeb, 0x21, 0x1c, 0x80, 0x31, byte(len(protocol))}
			sink := &otlpSink{spans: map[string]string{}, trace: tid}
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			if protocol == "grpc" {
				gs := grpc.NewServer()
				collectortrace.RegisterTraceServiceServer(gs, sink)
				go func() { _ = gs.Serve(ln) }()
				t.Cleanup(gs.Stop)
			} else {
				hs := &http.Server{Handler: sink, ReadHeaderTimeout: 5 * time.Second}
				go func() { _ = hs.Serve(ln) }()
				t.Cleanup(func() { _ = hs.Close() })
			}
			t.Setenv("OTEL_TRACES_EXPORTER", "otlp")
			t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
			t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+ln.Addr().String())
			t.Setenv("OTEL_SERVICE_NAME", "meshd-"+protocol)
			t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
			info := runNode(t, "traced", func(c *Config) { c.TracingFromEnv = true })
			nc := natstest.ConnectURL(t, info.NATSURL)
			m := &nats.Msg{Subject: subjects.DefaultPrefix.Ingress("echo/t", ""), Header: nats.Header{}, Data: []byte("hi")}
			m.Header.Set(hub.HeaderExpectResponse, "true")
			m.Header["traceparent"] = []string{fmt.Sprintf("00-%x-00f067aa0ba902b7-01", tid)}
			r, err := nc.RequestMsg(m, 20*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if _, verr := verdict.Decode(r.Header); verr != nil {
				t.Fatal(verr)
			}
			want := []string{"ingress request echo", "request echo", "receive echo", "process echo"}
			natstest.Eventually(t, 20*time.Second, func() bool {
				got := sink.got()
				for _, n := range want {
					if got[n] == "" {
						return false
					}
				}
				return true
			}, "spans %v exported", want)
			for n, svc := range sink.got() {
				if svc != "meshd-"+protocol {
					t.Errorf("span %q: service.name %q", n, svc)
				}
			}
		})
	}
}

// TestTracingEnv: off without the environment (or with
// OTEL_TRACES_EXPORTER=none, OTEL_SDK_DISABLED); an invalid exporter or
// protocol is a configuration error at start, not a silent default.
func TestTracingEnv(t *testing.T) {
	for _, k := range []string{"OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_SDK_DISABLED", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		t.Setenv(k, "")
	}
	if TracingEnabledByEnv() {
		t.Fatal("tracing on without the environment")
	}
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
	if !TracingEnabledByEnv() {
		t.Fatal("an OTLP endpoint does not turn tracing on")
	}
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	if TracingEnabledByEnv() {
		t.Fatal("OTEL_TRACES_EXPORTER=none traces")
	}
	t.Setenv("OTEL_TRACES_EXPORTER", "otlp")
	t.Setenv("OTEL_SDK_DISABLED", "true")
	if TracingEnabledByEnv() {
		t.Fatal("OTEL_SDK_DISABLED=true traces")
	}
	t.Setenv("OTEL_SDK_DISABLED", "")
	for _, bad := range [][2]string{
		{"OTEL_TRACES_EXPORTER", "jaegerx"}, {"OTEL_EXPORTER_OTLP_PROTOCOL", "smoke-signals"},
		{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json"},
	} {
		t.Setenv("OTEL_TRACES_EXPORTER", "otlp")
		t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
		t.Setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "")
		t.Setenv(bad[0], bad[1])
		err := Run(context.Background(), Config{Name: "badenv", Listen: "127.0.0.1:0", DataDir: t.TempDir(), TracingFromEnv: true,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s=%s: %v, want ErrInvalidConfig", bad[0], bad[1], err)
		}
		// The error names the variable and its value (issue 24).
		if want := fmt.Sprintf("%s=%q", bad[0], bad[1]); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s=%s: %v does not name %s", bad[0], bad[1], err, want)
		}
	}
}

// TestSpanExporterFromEnv: OTEL_TRACES_EXPORTER=console prints spans
// (stdouttrace), anything else exports over OTLP (autoexport's choice,
// which spanExporterFromEnv follows); TestTracingFromEnv sends over both
// OTLP protocols to a receiver.
func TestSpanExporterFromEnv(t *testing.T) {
	for _, k := range []string{"OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"} {
		t.Setenv(k, "")
	}
	for _, c := range []struct {
		exporter, protocol string
		console            bool
	}{{"console", "", true}, {"console", "grpc", true}, {"", "", false}, {"otlp", "grpc", false}, {"otlp", "http/protobuf", false}} {
		t.Setenv("OTEL_TRACES_EXPORTER", c.exporter)
		t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", c.protocol)
		exp, err := spanExporterFromEnv(context.Background())
		if err != nil {
			t.Fatalf("%+v: %v", c, err)
		}
		_, console := exp.(*stdouttrace.Exporter)
		_, otlp := exp.(*otlptrace.Exporter)
		if console != c.console || otlp == c.console {
			t.Errorf("%+v: exporter %T", c, exp)
		}
		_ = exp.Shutdown(context.Background())
	}
}
