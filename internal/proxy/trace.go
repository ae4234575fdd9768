package proxy

import (
	"context"
	"encoding/json"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"kvrouter/internal/admission"
	"kvrouter/internal/fleet"
	"kvrouter/internal/group"
	"kvrouter/internal/tracing"
)

// Span names and attribute keys of kvrouter's traces (docs/serve.md,
// "Tracing"). Request-level attributes follow OpenTelemetry's HTTP and GenAI
// semantic conventions where one exists (http.response.status_code,
// gen_ai.request.model, gen_ai.usage.input_tokens); the routing ones are
// kvrouter's own.
const (
	spanEngine = "kvrouter.engine"

	attrModel        = "gen_ai.request.model"
	attrPromptTokens = "gen_ai.usage.input_tokens"
	attrStatus       = "http.response.status_code"
	attrRequestID    = "kvrouter.request_id"
	attrOutcome      = "kvrouter.outcome"
	attrReplica      = "kvrouter.replica"
	attrCached       = "kvrouter.predicted_cached_tokens"
	attrPolicy       = "kvrouter.policy"
	attrCandidates   = "kvrouter.candidates"
	attrRetries      = "kvrouter.retries"
	attrAttempt      = "kvrouter.attempt"
	attrRoute        = "kvrouter.route"
)

// maxCandidatesAttr bounds the decision explain recorded on a span, in
// bytes of JSON.
const maxCandidatesAttr = 4096

// tracer returns the server's tracer.
func (s *Server) tracer() trace.Tracer {
	return s.tr.Provider.Tracer(admission.TracerName)
}

// startSpan starts x's server span as a child of the client's trace
// context (traceparent), and makes it x's request context.
func (s *Server) startSpan(x *exchange, route string) {
	ctx := s.tr.Propagator.Extract(x.r.Context(), propagation.HeaderCarrier(x.r.Header))
	ctx, x.Span = s.tracer().Start(ctx, "POST "+route, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String(attrRequestID, x.ID), attribute.String(attrRoute, route)))
	x.r = x.r.WithContext(ctx)
	x.Ctx = ctx
}

// endSpan records x's outcome on its span and ends it.
func (s *Server) endSpan(x *exchange) {
	if x.Span == nil || !x.Span.IsRecording() {
		return
	}
	attrs := []attribute.KeyValue{
		attribute.Int(attrStatus, x.status), attribute.String(attrOutcome, x.outcome),
		attribute.Int(attrRetries, x.retries),
	}
	if x.Req != nil {
		attrs = append(attrs, attribute.String(attrModel, x.Req.Model))
	}
	if x.Tokens != nil {
		attrs = append(attrs, attribute.Int(attrPromptTokens, len(x.Tokens)))
	}
	if x.replica != "" {
		attrs = append(attrs, attribute.String(attrReplica, x.replica), attribute.Int(attrCached, x.cached))
	}
	x.Span.SetAttributes(attrs...)
	if x.status >= 500 || x.outcome == outcomeUpstream || x.outcome == outcomeTimeout {
		msg := x.outcome
		if x.err != nil {
			msg = x.err.Error()
		}
		x.Span.SetStatus(codes.Error, msg)
	}
	x.Span.End()
}

// traceDecision records a decision on the request span: policy and the
// candidates' cached blocks and costs (the /v1/route explain).
func (s *Server) traceDecision(x *exchange, d group.Decision) {
	if x.Span == nil || !x.Span.IsRecording() {
		return
	}
	attrs := []attribute.KeyValue{attribute.String(attrReplica, d.Replica), attribute.Int(attrCached, d.CachedTokens)}
	if d.Policy != "" {
		attrs = append(attrs, attribute.String(attrPolicy, d.Policy))
	}
	if d.Explain != nil {
		if b, err := json.Marshal(d.Explain); err == nil {
			if len(b) > maxCandidatesAttr {
				b = append(b[:maxCandidatesAttr-3], "..."...)
			}
			attrs = append(attrs, attribute.String(attrCandidates, string(b)))
		}
	}
	x.Span.AddEvent("decision", trace.WithAttributes(attrs...))
}

// startLeg starts the span of one engine attempt under ctx; the caller
// writes the returned context's trace context into the upstream request's
// headers (traceparent), so that the engine's own spans join the trace.
func (s *Server) startLeg(ctx context.Context, x *exchange, ep *fleet.Endpoint) (context.Context, trace.Span) {
	return s.tracer().Start(ctx, spanEngine, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String(attrReplica, ep.Name()), attribute.Int(attrAttempt, x.retries)))
}

// endLeg records an engine attempt's answer status (0: none) and ends it.
func endLeg(span trace.Span, status int, retried bool, err error) {
	if status > 0 {
		span.SetAttributes(attribute.Int(attrStatus, status))
	}
	if retried {
		span.SetAttributes(attribute.Bool("kvrouter.retried", true))
	}
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	} else if status >= 500 {
		span.SetStatus(codes.Error, http.StatusText(status))
	}
	span.End()
}

// tracingOrDisabled is t, or tracing that records nothing when t is nil.
func tracingOrDisabled(t *tracing.Tracing) *tracing.Tracing {
	if t == nil {
		return tracing.Disabled()
	}
	return t
}
