package proxy

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"kvrouter/internal/tracing"
)

// TestPDTraceBothLegs: a disaggregated request's trace has one
// kvrouter.engine span per leg under the request span (the prefill one
// marked kvrouter.pd_leg=prefill), and each engine received a traceparent
// naming its own leg's span.
func TestPDTraceBothLegs(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	rg := newPDRigTraced(t, twoByTwo, &tracing.Tracing{Provider: tp, Propagator: propagation.TraceContext{}, Enabled: true})
	resp := rg.post(context.Background(), "/v1/completions", pdPrompt(7, 3000, 5, true))
	body := readAll(t, resp)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Kvrouter-Path") != pathDisaggregated {
		t.Fatalf("%d %v %s", resp.StatusCode, resp.Header, body)
	}
	var root sdktrace.ReadOnlySpan
	legs := map[string]sdktrace.ReadOnlySpan{} // by replica
	for _, s := range rec.Ended() {
		switch s.Name() {
		case "POST /v1/completions":
			root = s
		case spanEngine:
			for _, a := range s.Attributes() {
				if a.Key == attrReplica {
					legs[a.Value.AsString()] = s
				}
			}
		}
	}
	if root == nil || len(legs) != 2 {
		t.Fatalf("spans: request %v, engine legs %v", root != nil, len(legs))
	}
	prefill, decode := resp.Header.Get("X-Kvrouter-Prefill-Replica"), resp.Header.Get("X-Kvrouter-Replica")
	for name, leg := range legs {
		if leg.Parent().SpanID() != root.SpanContext().SpanID() {
			t.Errorf("%s leg is not a child of the request span", name)
		}
		marked := false
		for _, a := range leg.Attributes() {
			marked = marked || (a.Key == "kvrouter.pd_leg" && a.Value.AsString() == "prefill")
		}
		if marked != (name == prefill) {
			t.Errorf("%s leg: pd_leg=prefill %v, prefill replica %s, decode %s", name, marked, prefill, decode)
		}
		tp := (*rg.engine(name).lastHeader.Load()).Get("Traceparent")
		if !strings.Contains(tp, leg.SpanContext().SpanID().String()) || !strings.Contains(tp, root.SpanContext().TraceID().String()) {
			t.Errorf("%s got traceparent %q, want its leg span %s in trace %s", name, tp, leg.SpanContext().SpanID(), root.SpanContext().TraceID())
		}
	}
}
