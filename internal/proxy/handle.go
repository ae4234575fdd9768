package proxy

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"kvrouter/internal/admission"
	"kvrouter/internal/fleet"
	"kvrouter/internal/frontmetrics"
	"kvrouter/internal/group"
	"kvrouter/internal/request"
)

// exchange is one client request's state on the HTTP front, shared by its
// attempts, for the final log line and metrics: admission's Flow
// and what the HTTP exchange adds.
type exchange struct {
	admission.Flow
	// m is the request's model group (Flow.Group's), nil until admission
	// resolved it.
	m *model
	// hooks are the front's stages of the request, plugged in by its
	// group's features (feature.go).
	hooks   hooks
	w       http.ResponseWriter
	r       *http.Request
	replica string   // last replica tried
	held    []string // replicas whose series this exchange holds (Server.holds)
	cached  int
	// indexCached is what the index said the chosen engine holds, in
	// tokens, trusted or not; hit is what the engine reported (trust.go).
	indexCached int
	hit         hitReport
	status      int    // status answered to the client
	outcome     string // requests_total outcome label
	retries     int
	// abort: the response is broken after its first byte and is not an
	// event stream; the handler ends the connection (http.ErrAbortHandler).
	abort bool
	// streamErr: the engine's event stream carried an error event.
	streamErr bool
	err       error
	// bodyHeld is the body_budget the request's body holds (body.go),
	// given back by finish.
	bodyHeld int64
}

// newExchange starts the HTTP front's state of request r.
func (s *Server) newExchange(w http.ResponseWriter, r *http.Request) *exchange {
	x := &exchange{w: w, r: r, Flow: admission.Flow{Ctx: r.Context(), ID: requestID(r), Start: s.deps.Now(), Header: r.Header.Get}}
	x.hooks = newHooks(x)
	w.Header().Set("X-Request-Id", x.ID)
	return x
}

// Outcome labels of kvrouter_proxy_requests_total (front="http"), from
// the set both fronts share.
const (
	outcomeOK           = frontmetrics.OutcomeOK           // engine answered 2xx/3xx, relayed whole
	outcomeEngineError  = frontmetrics.OutcomeEngineError  // engine answered 4xx/5xx, relayed
	outcomeBadRequest   = frontmetrics.OutcomeBadRequest   // rejected by the router (400, 401, 404, 413)
	outcomeNoReplica    = frontmetrics.OutcomeNoReplica    // 503: no replica up
	outcomeUpstream     = frontmetrics.OutcomeUpstream     // connect failed or engine broke (502, or a broken stream)
	outcomeTimeout      = frontmetrics.OutcomeTimeout      // first-byte or idle timeout
	outcomeClientClosed = frontmetrics.OutcomeClientClosed // client left (logged as 499)
	outcomeRouteOnly    = frontmetrics.OutcomeRouteOnly    // decision explained, not forwarded
)

// serveInference handles POST /v1/completions and /v1/chat/completions.
func (s *Server) serveInference(w http.ResponseWriter, r *http.Request, k request.Kind) {
	x := s.newExchange(w, r)
	s.startSpan(x, r.URL.Path)
	defer s.finish(x)
	if !s.prepare(x.Ctx, x, k) {
		return
	}
	if v := r.Header.Get("X-Kvrouter-Route-Only"); v != "" && v != "0" && v != "false" {
		s.explain(x.Ctx, x)
		return
	}
	s.forward(x.Ctx, x)
}

// serveRoute handles POST /v1/route: a completion, chat or Responses body
// (told apart by "messages", then "input" without "prompt"), answered with
// the decision instead of forwarded.
func (s *Server) serveRoute(w http.ResponseWriter, r *http.Request) {
	x := s.newExchange(w, r)
	s.startSpan(x, r.URL.Path)
	defer s.finish(x)
	body, ok := s.readBody(x)
	if !ok {
		return
	}
	if !s.parse(x.Ctx, x, request.Sniff(body), body) {
		return
	}
	s.explain(x.Ctx, x)
}

// prepare reads, parses and tokenizes the request; false when it has
// answered an error.
func (s *Server) prepare(ctx context.Context, x *exchange, k request.Kind) bool {
	body, ok := s.readBody(x)
	return ok && s.parse(ctx, x, k, body)
}

// parse runs admission of body (package admission); false when it has
// answered the error.
func (s *Server) parse(ctx context.Context, x *exchange, k request.Kind, body []byte) bool {
	if e := s.admit(ctx, x, k, body); e != nil {
		s.fail(x, requestError(e), outcomeBadRequest)
		return false
	}
	return true
}

// fail answers an error before any byte of a response was written.
func (s *Server) fail(x *exchange, e *apiError, outcome string) {
	e.write(x.w)
	x.status, x.outcome = e.status, outcome
	if x.err == nil {
		x.err = e
	}
}

// explain answers the routing decision as JSON without forwarding (or
// as x's features explain it, hooks.explain).
func (s *Server) explain(ctx context.Context, x *exchange) {
	if x.hooks.explain(ctx, x) {
		return
	}
	eps, retry, err := s.healthy(nil, x)
	if err != nil {
		s.noReplica(x, retry, err)
		return
	}
	d, err := s.core.Decide(x.Ctx, &x.Flow, s.core.RouteInput(x.Ctx, &x.Flow, names(eps), true))
	if err != nil {
		s.fail(x, serverError("routing: "+err.Error()), outcomeUpstream)
		return
	}
	if d.Release != nil {
		d.Release()
	}
	s.holds.Hold(&x.held, d.Replica)
	x.replica, x.cached = d.Replica, d.CachedTokens
	out := struct {
		Model        string                `json:"model"`
		Replica      string                `json:"replica"`
		URL          string                `json:"url,omitempty"`
		CachedTokens int                   `json:"cached_tokens"`
		PromptTokens int                   `json:"prompt_tokens"`
		Tokenized    bool                  `json:"tokenized"`
		Shadow       *group.ShadowDecision `json:"shadow,omitempty"`
		Explain      any                   `json:"explain,omitempty"`
	}{x.Req.Model, d.Replica, "", d.CachedTokens, len(x.Tokens), x.Tokens != nil, d.Shadow, d.Explain}
	if ep := s.deps.Fleet.Endpoint(d.Replica); ep != nil {
		out.URL = ep.URL()
	}
	b, err := json.Marshal(out)
	if err != nil {
		s.fail(x, serverError("encoding decision: "+err.Error()), outcomeUpstream)
		return
	}
	h := x.w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Kvrouter-Replica", d.Replica)
	h.Set("X-Kvrouter-Cached-Tokens", strconv.Itoa(d.CachedTokens))
	x.w.WriteHeader(http.StatusOK)
	_, _ = x.w.Write(b)
	x.status, x.outcome = http.StatusOK, outcomeRouteOnly
}

func (s *Server) noReplica(x *exchange, retry time.Duration, err error) {
	s.fail(x, &apiError{status: http.StatusServiceUnavailable, typ: typeServiceUnavailable,
		message: admission.NoReplicaMessage(x.Req.Model), retryAfter: max(retry, time.Second)}, outcomeNoReplica)
	x.err = err
}

// admit runs admission of body for x (admission.Core.Admit), plugging in
// the front's stages of each of its group's features (frontStages), and
// sets x's model group.
func (s *Server) admit(ctx context.Context, x *exchange, k request.Kind, body []byte) *request.Error {
	x.hooks = newHooks(x)
	x.Plug = func(ctx context.Context, f admission.Feature, g *admission.Group) {
		if st, ok := f.(frontStages); ok {
			st.plug(ctx, x, s.models[g.Cfg.Name])
		}
	}
	e := s.core.Admit(ctx, &x.Flow, k, body)
	if x.Group != nil {
		x.m = s.models[x.Group.Cfg.Name]
	}
	return e
}

func names(eps []*fleet.Endpoint) []string {
	out := make([]string, len(eps))
	for i, e := range eps {
		out[i] = e.Name()
	}
	return out
}

// modelUnknown is the model label and log value of a request whose model
// was not read or is not configured.
const modelUnknown = "unknown"

// truncate returns s cut to at most n bytes (admission.Truncate).
func truncate(s string, n int) string { return admission.Truncate(s, n) }

// finish records the request's metrics and its one log line, then aborts
// the connection if the response broke after its first byte or the
// client left.
func (s *Server) finish(x *exchange) {
	// The label is a configured model or "unknown" (bounded cardinality:
	// a client cannot create series); the log line names what was asked.
	label, logged := modelUnknown, modelUnknown
	if x.Asked != "" {
		logged = truncate(x.Asked, 256)
		if _, ok := s.models[x.Asked]; ok {
			label = x.Asked
		} else if x.m != nil { // an adapter or alias: its group
			label = x.m.Cfg.Name
		}
	}
	if x.outcome == "" {
		x.outcome = outcomeOK
	}
	extra := x.hooks.end(x, nil)
	s.giveBody(x.bodyHeld)
	s.m.requests.WithLabelValues(label, x.replica, x.outcome).Inc()
	s.holds.Release(&x.held)
	lvl := slog.LevelInfo
	if x.status >= 500 || x.outcome == outcomeUpstream || x.outcome == outcomeTimeout {
		lvl = slog.LevelWarn
	}
	if s.log.Enabled(x.r.Context(), lvl) {
		attrs := []slog.Attr{
			slog.String("request_id", x.ID), slog.String("model", logged),
			slog.String("replica", x.replica), slog.Int("status", x.status),
			slog.String("outcome", x.outcome), slog.Int("cached_tokens", x.cached),
			slog.Int("prompt_tokens", len(x.Tokens)), slog.Int("retries", x.retries),
			slog.Float64("duration_ms", float64(s.deps.Now().Sub(x.Start).Microseconds())/1000),
		}
		attrs = append(attrs, extra...)
		if x.err != nil {
			attrs = append(attrs, slog.String("err", x.err.Error()))
		}
		s.log.LogAttrs(x.r.Context(), lvl, "request", attrs...)
	}
	s.endSpan(x)
	// A client that left gets no answer: net/http would otherwise write
	// an empty 200 (nothing written yet) or end a stream as if complete,
	// which a client that only shut its side for writing would read.
	if x.abort || x.outcome == outcomeClientClosed {
		panic(http.ErrAbortHandler) // net/http's documented way to cut a response short
	}
}
