// Package tracing sets up OpenTelemetry traces for kvrouter from the
// standard OTEL_* environment variables: off unless an OTLP endpoint is
// configured, exported over OTLP gRPC or HTTP with the OpenTelemetry Go
// SDK, W3C trace context propagated (traceparent, tracestate) so that a
// vLLM engine started with --otlp-traces-endpoint joins the trace.
//
// Variables read here (the OpenTelemetry specification's "Environment
// Variable Specification" and "OTLP Exporter Configuration"):
//
//	OTEL_SDK_DISABLED=true                   off
//	OTEL_TRACES_EXPORTER                     otlp or none; unset: otlp when an endpoint is set
//	OTEL_EXPORTER_OTLP_ENDPOINT              or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: turns tracing on
//	OTEL_EXPORTER_OTLP_TRACES_PROTOCOL       or OTEL_EXPORTER_OTLP_PROTOCOL: grpc or
//	                                         http/protobuf (default, as the specification says)
//
// The exporters read the rest themselves (endpoint, headers, timeout,
// insecure, certificates), the SDK reads OTEL_SERVICE_NAME,
// OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER(_ARG) and OTEL_BSP_*.
package tracing

import (
	"context"
	"fmt"
	"strings"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Tracing is what serve traces with: a tracer provider and the W3C
// propagator. The zero value is not usable; Disabled and FromEnv make one.
type Tracing struct {
	// Provider makes tracers; a no-op provider when tracing is off.
	Provider trace.TracerProvider
	// Propagator reads and writes traceparent/tracestate headers.
	Propagator propagation.TextMapPropagator
	// Enabled reports whether spans are exported.
	Enabled bool
	// Protocol is "grpc" or "http/protobuf" when Enabled.
	Protocol string
	shutdown func(context.Context) error
}

// Disabled returns tracing that records nothing; it still propagates an
// incoming trace context to the engines.
func Disabled() *Tracing {
	return &Tracing{Provider: noop.NewTracerProvider(), Propagator: propagation.TraceContext{}, shutdown: func(context.Context) error { return nil }}
}

// FromEnv configures tracing from getenv (os.Getenv in serve), version
// going into service.version. Errors: an unknown exporter or protocol, or
// an exporter that cannot be built; a collector that is down is not an
// error (spans are dropped and the SDK logs it).
func FromEnv(ctx context.Context, getenv func(string) string, version string) (*Tracing, error) {
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return Disabled(), nil
	}
	switch exp := strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")); exp {
	case "none":
		return Disabled(), nil
	case "":
		if getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" {
			return Disabled(), nil
		}
	case "otlp":
	default:
		return nil, fmt.Errorf("tracing: OTEL_TRACES_EXPORTER %q: kvrouter exports otlp (or none)", exp)
	}
	proto := strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"))
	if proto == "" {
		proto = strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_PROTOCOL"))
	}
	if proto == "" {
		proto = "http/protobuf"
	}
	var (
		exporter sdktrace.SpanExporter
		err      error
	)
	switch proto {
	case "grpc":
		exporter, err = otlptracegrpc.New(ctx)
	case "http/protobuf":
		exporter, err = otlptracehttp.New(ctx)
	default:
		return nil, fmt.Errorf("tracing: OTLP protocol %q: want grpc or http/protobuf", proto)
	}
	if err != nil {
		return nil, fmt.Errorf("tracing: OTLP %s exporter: %w", proto, err)
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(semconv.ServiceName("kvrouter"), semconv.ServiceVersion(version)))
	if err != nil {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	// The environment (OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES) wins.
	if env, err := resource.New(ctx, resource.WithFromEnv()); err == nil {
		if merged, err := resource.Merge(res, env); err == nil {
			res = merged
		}
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exporter), sdktrace.WithResource(res))
	return &Tracing{
		Provider:   tp,
		Propagator: propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}),
		Enabled:    true,
		Protocol:   proto,
		shutdown:   tp.Shutdown,
	}, nil
}

// Shutdown flushes buffered spans and stops the exporter, within ctx.
func (t *Tracing) Shutdown(ctx context.Context) error { return t.shutdown(ctx) }
