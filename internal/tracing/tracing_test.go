package tracing

import (
	"context"
	"strings"
	"testing"
	"time"
)

func env(kv ...string) func(string) string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) string { return m[k] }
}

func TestFromEnv(t *testing.T) {
	ctx := context.Background()
	for _, tt := range []struct {
		name     string
		env      func(string) string
		enabled  bool
		protocol string
		err      string
	}{
		{"nothing set: off", env(), false, "", ""},
		{"endpoint: on, http/protobuf by default", env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"), true, "http/protobuf", ""},
		{"traces endpoint, grpc", env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://127.0.0.1:4317", "OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"), true, "grpc", ""},
		{"traces protocol wins", env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317", "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc"), true, "grpc", ""},
		{"sdk disabled", env("OTEL_SDK_DISABLED", "true", "OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"), false, "", ""},
		{"exporter none", env("OTEL_TRACES_EXPORTER", "none", "OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"), false, "", ""},
		{"exporter otlp without endpoint: the default endpoint", env("OTEL_TRACES_EXPORTER", "otlp"), true, "http/protobuf", ""},
		{"exporter zipkin", env("OTEL_TRACES_EXPORTER", "zipkin"), false, "", `OTEL_TRACES_EXPORTER "zipkin"`},
		{"protocol http/json", env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://x", "OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"), false, "", `protocol "http/json"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tr, err := FromEnv(ctx, tt.env, "test")
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err %v, want one naming %s", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				// Nothing listens: the flush fails fast, bounded.
				sctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
				defer cancel()
				_ = tr.Shutdown(sctx)
			}()
			if tr.Enabled != tt.enabled || tr.Protocol != tt.protocol {
				t.Errorf("enabled %v protocol %q, want %v %q", tr.Enabled, tr.Protocol, tt.enabled, tt.protocol)
			}
			_, span := tr.Provider.Tracer("t").Start(ctx, "s")
			if span.IsRecording() != tt.enabled {
				t.Errorf("span recording %v, want %v", span.IsRecording(), tt.enabled)
			}
			span.End()
		})
	}
}
