package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/natsmesh/natsmesh/subjects"
)

// jaegerConfig is a Jaeger (v2, collector-based) with only what the test
// needs, every port chosen free: OTLP over gRPC and HTTP, in-memory
// storage, the query service.
const jaegerConfig = `service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
extensions:
  jaeger_query:
    storage:
      traces: mem
    http:
      endpoint: 127.0.0.1:%d
    grpc:
      endpoint: 127.0.0.1:%d
  jaeger_storage:
    backends:
      mem:
        memory:
          max_traces: 10000
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 127.0.0.1:%d
      http:
        endpoint: 127.0.0.1:%d
processors:
  batch:
    timeout: 100ms
exporters:
  jaeger_storage_exporter:
    trace_storage: mem
`

type jaeger struct {
	query, otlpGRPC, otlpHTTP string // host:port
}

func startJaeger(t *testing.T) jaeger {
	t.Helper()
	bin := JaegerBinary(t)
	j := jaeger{}
	q, qg, g, h := FreePort(t), FreePort(t), FreePort(t), FreePort(t)
	j.query, j.otlpGRPC, j.otlpHTTP = fmt.Sprintf("127.0.0.1:%d", q), fmt.Sprintf("127.0.0.1:%d", g), fmt.Sprintf("127.0.0.1:%d", h)
	cfg := filepath.Join(t.TempDir(), "jaeger.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(jaegerConfig, q, qg, g, h)), 0o644); err != nil {
		t.Fatal(err)
	}
	p := Start(t, bin, "--config", "file:"+cfg)
	for _, addr := range []string{j.query, j.otlpGRPC, j.otlpHTTP} {
		deadline := time.Now().Add(60 * time.Second)
		for !tcpOpen(addr) {
			if time.Now().After(deadline) {
				t.Fatalf("jaeger: %s not listening\n%s", addr, p.Stderr())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return j
}

// jaegerTrace is the query API's answer (GET /api/traces/{id}).
type jaegerTrace struct {
	Data []struct {
		Spans []struct {
			SpanID        string `json:"spanID"`
			OperationName string `json:"operationName"`
			ProcessID     string `json:"processID"`
			References    []struct {
				RefType string `json:"refType"`
				SpanID  string `json:"spanID"`
			} `json:"references"`
			Tags []struct {
				Key   string `json:"key"`
				Value any    `json:"value"`
			} `json:"tags"`
		} `json:"spans"`
		Processes map[string]struct {
			ServiceName string `json:"serviceName"`
		} `json:"processes"`
	} `json:"data"`
}

// span is one span of a trace as Jaeger returns it.
type span struct {
	id, name, service, parent string
	tags                      map[string]string
}

func (j jaeger) trace(t *testing.T, id trace.TraceID) map[string]span {
	resp, err := http.Get("http://" + j.query + "/api/traces/" + id.String())
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == http.StatusNotFound {
		return nil
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("jaeger query: %s %s", resp.Status, body)
	}
	var jt jaegerTrace
	if err := json.Unmarshal(body, &jt); err != nil {
		t.Fatalf("jaeger query: %v: %s", err, body)
	}
	out := map[string]span{}
	for _, d := range jt.Data {
		for _, s := range d.Spans {
			sp := span{id: s.SpanID, name: s.OperationName, service: d.Processes[s.ProcessID].ServiceName, tags: map[string]string{}}
			for _, r := range s.References {
				if r.RefType == "CHILD_OF" {
					sp.parent = r.SpanID
				}
			}
			for _, tg := range s.Tags {
				sp.tags[tg.Key] = fmt.Sprint(tg.Value)
			}
			out[s.OperationName] = sp
		}
	}
	return out
}

// TestJaegerEndToEnd: a real Jaeger receives OTLP from two meshd — one
// exporting over gRPC, one over HTTP/protobuf, as the standard OTEL_*
// environment tells them — and from an outside nats.go client that sends a
// request through the ingress with its own traceparent. Jaeger's query API
// returns one trace: the client's span, then the ingress span and the
// request span of the node that took the ingress, then the intake and the
// turn on the node hosting the kind, each the child of the one before,
// with the messaging attributes. The ingress is a queue group: requests
// are sent until one went through the node that hosts nothing, so that the
// trace crosses both processes.
func TestJaegerEndToEnd(t *testing.T) {
	j := startJaeger(t)
	ns := StartNATSServer(t)
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
	t.Setenv("OTEL_TRACES_EXPORTER", "otlp")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+j.otlpGRPC)
	t.Setenv("OTEL_SERVICE_NAME", "meshd-front")
	StartMeshd(t, "--name", "front", "--nats-url", ns.URL, "--http", "", "--hubs", "")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+j.otlpHTTP)
	t.Setenv("OTEL_SERVICE_NAME", "meshd-back")
	StartMeshd(t, "--name", "back", "--nats-url", ns.URL, "--http", "", "--hubs", "echo")

	// The outside client: the plain OpenTelemetry SDK and nats.go.
	exp, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpoint(j.otlpHTTP), otlptracehttp.WithInsecure())
	if err != nil {
		t.Fatal(err)
	}
	res := resource.NewSchemaless(semconv.ServiceName("e2e-client"))
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithResource(res))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	nc, err := nats.Connect(ns.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()

	want := []struct{ name, service string }{
		{"client request", "e2e-client"},
		{"ingress request echo", "meshd-front"},
		{"request echo", "meshd-front"},
		{"receive echo", "meshd-back"},
		{"process echo", "meshd-back"},
	}
	crossed := false
	for i := 0; i < 30 && !crossed; i++ {
		ctx, root := tp.Tracer("e2e").Start(context.Background(), "client request", trace.WithSpanKind(trace.SpanKindClient))
		m := nats.NewMsg(subjects.DefaultPrefix.Ingress("echo/traced", ""))
		m.Header.Set("Mesh-Expect-Response", "true")
		m.Data = []byte(fmt.Sprint(i))
		// As an HTTP client would: the header is written "Traceparent".
		propagation.TraceContext{}.Inject(ctx, propagation.HeaderCarrier(http.Header(m.Header)))
		r, err := nc.RequestMsg(m, 20*time.Second)
		root.End()
		if err != nil {
			t.Fatal(err)
		}
		if r.Header.Get("Mesh-Verdict") != "Accepted" || string(r.Data) != fmt.Sprint(i) {
			t.Fatalf("reply %q %v", r.Data, r.Header)
		}
		tid := root.SpanContext().TraceID()
		var spans map[string]span
		deadline := time.Now().Add(60 * time.Second)
		for {
			spans = j.trace(t, tid)
			if len(spans) >= len(want) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("trace %s in jaeger: %d spans %v, want %d", tid, len(spans), spans, len(want))
			}
			time.Sleep(100 * time.Millisecond)
		}
		for k, w := range want {
			s, ok := spans[w.name]
			if !ok {
				t.Fatalf("trace %s: no span %q: %v", tid, w.name, spans)
			}
			if k == 0 {
				if s.parent != "" {
					t.Errorf("client span has a parent %s", s.parent)
				}
				continue
			}
			if p := spans[want[k-1].name]; s.parent != p.id {
				t.Errorf("trace %s: %q is the child of %s, want %q (%s)", tid, w.name, s.parent, want[k-1].name, p.id)
			}
		}
		for _, n := range []string{"request echo", "receive echo", "process echo"} {
			tg := spans[n].tags
			if tg["messaging.system"] != "nats" || tg["messaging.destination.name"] != "echo/traced" || tg["mesh.verdict"] != "Accepted" || tg["messaging.message.id"] == "" {
				t.Errorf("%s: tags %v", n, tg)
			}
		}
		if spans["ingress request echo"].service != spans["process echo"].service {
			crossed = true
			for _, w := range want {
				if got := spans[w.name].service; got != w.service {
					t.Errorf("%s: service %q, want %q", w.name, got, w.service)
				}
			}
		} else if !strings.HasPrefix(spans["ingress request echo"].service, "meshd-back") {
			t.Errorf("ingress span from %q", spans["ingress request echo"].service)
		}
	}
	if !crossed {
		t.Fatal("30 requests, none took the ingress of the node that hosts nothing")
	}
}
