package daemon

import (
	"context"
	"fmt"
	"os"
	"strings"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"

	"github.com/natsmesh/natsmesh/internal/buildinfo"
)

// TracingEnabledByEnv reports whether the standard OpenTelemetry
// environment asks for traces: OTEL_TRACES_EXPORTER set to anything but
// "none", or an OTLP endpoint (OTEL_EXPORTER_OTLP_ENDPOINT,
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) given; and OTEL_SDK_DISABLED not
// "true". Without any of them tracing is off.
func TracingEnabledByEnv() bool {
	if strings.EqualFold(os.Getenv("OTEL_SDK_DISABLED"), "true") {
		return false
	}
	switch e := strings.TrimSpace(os.Getenv("OTEL_TRACES_EXPORTER")); e {
	case "none":
		return false
	case "":
		return os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
	}
	return true
}

// checkOTELEnv checks the variables that choose the exporter, so that an
// invalid one is named with its value.
func checkOTELEnv() error {
	if e := os.Getenv("OTEL_TRACES_EXPORTER"); e != "" && e != "otlp" && e != "console" && e != "none" {
		return fmt.Errorf("invalid OTEL_TRACES_EXPORTER=%q (want otlp, console or none)", e)
	}
	for _, k := range []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		if p := os.Getenv(k); p != "" {
			if p != "grpc" && p != "http/protobuf" {
				return fmt.Errorf("invalid %s=%q (want grpc or http/protobuf)", k, p)
			}
			break // the first one set is the one used
		}
	}
	return nil
}

// TracerProviderFromEnv builds an OpenTelemetry SDK tracer provider from
// the standard OTEL_* environment: OTEL_TRACES_EXPORTER (otlp, console, none),
// OTEL_EXPORTER_OTLP_PROTOCOL or OTEL_EXPORTER_OTLP_TRACES_PROTOCOL (grpc,
// http/protobuf), the OTLP endpoint, headers and timeout variables,
// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES, the sampler
// (OTEL_TRACES_SAMPLER, OTEL_TRACES_SAMPLER_ARG) and the batch processor's
// OTEL_BSP_* settings. The service name defaults to "meshd" and the
// service instance to the node name. It returns nil, nil when
// [TracingEnabledByEnv] is false, and an error matching ErrInvalidConfig
// for an invalid exporter or protocol, naming the variable and its value. The
// caller shuts the provider down (flushing its spans).
func TracerProviderFromEnv(ctx context.Context, node string) (*sdktrace.TracerProvider, error) {
	if !TracingEnabledByEnv() {
		return nil, nil
	}
	if err := checkOTELEnv(); err != nil {
		return nil, fmt.Errorf("%w: OpenTelemetry environment: %w", ErrInvalidConfig, err)
	}
	exp, err := spanExporterFromEnv(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: OpenTelemetry environment: %w", ErrInvalidConfig, err)
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName("meshd"), semconv.ServiceInstanceID(node), semconv.ServiceVersion(buildinfo.Read().Version)),
		resource.WithTelemetrySDK(),
		resource.WithFromEnv(), // OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES win
	)
	if err != nil {
		_ = exp.Shutdown(ctx)
		return nil, fmt.Errorf("%w: OpenTelemetry resource: %w", ErrInvalidConfig, err)
	}
	return sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res)), nil
}

// spanExporterFromEnv picks the span exporter the way
// go.opentelemetry.io/contrib/exporters/autoexport's NewSpanExporter does
// for traces (v0.72.0, spans.go): OTEL_TRACES_EXPORTER otlp (the default)
// or console; for otlp, OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, else
// OTEL_EXPORTER_OTLP_PROTOCOL, else http/protobuf. Each OTLP exporter reads
// its endpoint, headers, timeout, compression and TLS variables itself.
// autoexport is not imported because it also links the metric and log
// exporters, their SDKs and a Prometheus bridge, which meshd never uses:
// compiling them cost every cold `go test -race ./...` about 25 s of CPU.
// The variables were checked by checkOTELEnv.
func spanExporterFromEnv(ctx context.Context) (sdktrace.SpanExporter, error) {
	if os.Getenv("OTEL_TRACES_EXPORTER") == "console" {
		return stdouttrace.New()
	}
	proto := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if proto == "" {
		proto = os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	if proto == "grpc" {
		return otlptracegrpc.New(ctx)
	}
	return otlptracehttp.New(ctx)
}
