package proxy

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"kvrouter/internal/fleet"
	"kvrouter/internal/frontmetrics"
	"kvrouter/internal/kvindex"
	"kvrouter/internal/request"
)

// exchange is one client request's state, shared by its attempts, for the
// final log line and metrics.
type exchange struct {
	w     http.ResponseWriter
	r     *http.Request
	id    string
	start time.Time
	req   *request.Parsed
	asked string // the model the body named, "" when it was not read
	m     *model
	// adapter is the LoRA adapter the request names as its model ("" for
	// the base model); loadAdapter: no healthy engine has it, load it on
	// the chosen one (adapters.go).
	adapter     string
	loadAdapter bool
	// route is the alias the request named (nil: none); usage is what its
	// answer reported (aliases.go).
	route   *AliasConfig
	usage   routeUsage
	fwd     []byte   // the body sent upstream
	tokens  []uint32 // nil when unknown
	replica string   // last replica tried
	held    []string // replicas whose series this exchange holds (Server.holds)
	// front is the front whose tokenizer series count the request: nil
	// for the HTTP front's own, the EPP's view for a Picker's.
	front  *frontmetrics.Front
	cached int
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
	// span is the request's trace span (a no-op one when tracing is off).
	span trace.Span
	// P/D (pd.go): only, when set, limits the replicas forward may choose;
	// noRouteTokens routes the decode leg by load alone; prefill names the
	// prefill leg's replica.
	only          func(name string) bool
	noRouteTokens bool
	prefill       string
	// Responses (responsepin.go): pin orders the engines of a request
	// continuing a stored response; bodyFor, when set, is the body sent to
	// an engine (instead of fwd).
	pin     *responsePin
	bodyFor func(engine string) []byte

	// mm are the prompt's multimodal items from the engine's render
	// (mediakeys.go); media is what its chat parts carry (media.go).
	mm    []kvindex.MMItem
	media request.Media

	// bodyHeld is the body_budget the request's body holds (body.go),
	// given back by finish.
	bodyHeld int64
	// enginePath is the path and query a request naming a response id is
	// sent to (responseget.go).
	enginePath string
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
	x := &exchange{w: w, r: r, id: requestID(r), start: s.deps.Now()}
	w.Header().Set("X-Request-Id", x.id)
	s.startSpan(x, r.URL.Path)
	defer s.finish(x)
	if !s.prepare(x, k) {
		return
	}
	if v := r.Header.Get("X-Kvrouter-Route-Only"); v != "" && v != "0" && v != "false" {
		s.explain(x)
		return
	}
	s.forward(x)
}

// serveRoute handles POST /v1/route: a completion, chat or Responses body
// (told apart by "messages", then "input" without "prompt"), answered with
// the decision instead of forwarded.
func (s *Server) serveRoute(w http.ResponseWriter, r *http.Request) {
	x := &exchange{w: w, r: r, id: requestID(r), start: s.deps.Now()}
	w.Header().Set("X-Request-Id", x.id)
	s.startSpan(x, r.URL.Path)
	defer s.finish(x)
	body, ok := s.readBody(x)
	if !ok {
		return
	}
	if !s.parse(x, request.Sniff(body), body) {
		return
	}
	s.explain(x)
}

// prepare reads, parses and tokenizes the request; false when it has
// answered an error.
func (s *Server) prepare(x *exchange, k request.Kind) bool {
	body, ok := s.readBody(x)
	return ok && s.parse(x, k, body)
}

// checkContentType accepts what vLLM (FastAPI) reads as JSON: no
// Content-Type, application/json, or application/*+json. Anything else
// (text/plain, curl -d's form type) is a 400, as vLLM answers it.
func checkContentType(ct string) *apiError {
	if ct == "" {
		return nil
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err == nil && (mt == "application/json" || strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json")) {
		return nil
	}
	return badRequest("", fmt.Sprintf("Content-Type %q: the body must be JSON (Content-Type: application/json)", ct))
}

func (s *Server) parse(x *exchange, k request.Kind, body []byte) bool {
	req, perr := request.Parse(k, body)
	if req != nil {
		x.asked = req.Model
	}
	var aerr *apiError
	if perr != nil {
		aerr = requestError(perr)
	}
	if aerr == nil {
		req, aerr = s.applyAlias(x, k, req, body)
	}
	if aerr == nil {
		aerr = s.refuseClientControls(body)
	}
	if aerr != nil {
		s.fail(x, aerr, outcomeBadRequest)
		return false
	}
	x.req = req
	m, ok := s.models[req.Model]
	if !ok {
		if m, ok = s.adapterModel(req.Model); ok {
			x.adapter = req.Model
		}
	}
	if !ok {
		s.fail(x, &apiError{status: http.StatusNotFound, typ: typeNotFound, param: "model",
			message: fmt.Sprintf("The model `%s` does not exist.", truncate(req.Model, maxEcho))}, outcomeBadRequest)
		return false
	}
	x.m = m
	x.media = req.Media()
	if e := checkMedia(x); e != nil {
		s.fail(x, e, outcomeBadRequest)
		return false
	}
	fwd, err := req.ForwardBody(!m.cfg.DisableHitReport)
	if err != nil {
		s.fail(x, badRequest("", err.Error()), outcomeBadRequest)
		return false
	}
	x.fwd = fwd
	x.tokens = s.tokenize(x)
	return true
}

// tokenize returns the prompt's token ids, or nil (route by load) when the
// tokenizer is "none" or fails: a tokenizer problem never fails a request.
func (s *Server) tokenize(x *exchange) []uint32 {
	req := x.req
	if req.PromptTokens != nil {
		return req.PromptTokens
	}
	if x.m.tok == nil {
		return nil
	}
	t0 := time.Now()
	ctx, span := s.startChild(x, spanTokenize, trace.SpanKindInternal)
	chat, body := req.Kind == request.Chat, req.Body
	if req.Kind == request.Responses { // rendered as the chat vLLM makes of it
		if req.Responses.ChatBody == nil {
			span.End()
			return nil
		}
		chat, body = true, req.Responses.ChatBody
	}
	var ids []uint32
	var mm []kvindex.MMItem
	var err error
	if creq, cerr := req.ChatRequest(); cerr == nil {
		ids, mm, err = chatTokens(x.m.tok, ctx, creq, body)
	} else {
		ids, mm, err = tokensMM(x.m.tok, ctx, chat, body, req.PromptText)
	}
	x.mm = mm
	tm := s.m.view
	if x.front != nil {
		tm = x.front
	}
	tm.Tokenize.WithLabelValues(req.Model).Observe(time.Since(t0).Seconds())
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	} else {
		span.SetAttributes(attribute.Int(attrPromptTokens, len(ids)))
	}
	span.End()
	if err != nil {
		tm.TokenizeErrors.WithLabelValues(req.Model).Inc()
		if errors.Is(err, ErrNoTokenizerEngine) {
			tm.TokenizerUnavailable.WithLabelValues(req.Model).Inc()
		}
		if s.log.Enabled(x.r.Context(), slog.LevelDebug) {
			s.log.Debug("tokenize failed, routing by load", "request_id", x.id, "model", req.Model, "err", err)
		}
		return nil
	}
	return ids
}

// fail answers an error before any byte of a response was written.
func (s *Server) fail(x *exchange, e *apiError, outcome string) {
	e.write(x.w)
	x.status, x.outcome = e.status, outcome
	if x.err == nil {
		x.err = e
	}
}

// routeInput builds the router's input for x, excluding tried replicas.
func (s *Server) routeInput(x *exchange, cands []string, dry bool) *RouteInput {
	in := &RouteInput{
		Model:      x.req.Model,
		RequestID:  x.id,
		Tokens:     x.tokens,
		CacheSalt:  x.req.CacheSalt,
		LoRA:       x.adapter,
		MaxTokens:  x.req.MaxTokens,
		Candidates: cands,
		DryRun:     dry,
	}
	if x.noRouteTokens {
		in.Tokens = nil
	}
	mediaRouteInput(x, in)
	if tr, ok := x.m.router.(textRouter); ok && tr.UsesText() {
		in.Text = x.req.RoutingText()
	}
	for _, h := range x.m.cfg.SessionHeaders {
		if v := x.r.Header.Get(h); v != "" {
			in.Session = v
			break
		}
	}
	return in
}

// decide asks the model's router, timing the decision.
func (s *Server) decide(x *exchange, in *RouteInput) (Decision, error) {
	t0 := time.Now()
	_, span := s.startChild(x, spanRoute, trace.SpanKindInternal)
	d, err := x.m.router.Route(in)
	s.m.decision.WithLabelValues(x.req.Model).Observe(time.Since(t0).Seconds())
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	} else {
		span.SetAttributes(attribute.String(attrReplica, d.Replica), attribute.Int(attrCached, d.CachedTokens),
			attribute.Int("kvrouter.candidate_count", len(in.Candidates)))
	}
	span.End()
	if err == nil && s.deps.OnDecision != nil {
		s.deps.OnDecision(x.req.Model, x.id, len(x.tokens), d)
	}
	return d, err
}

// explain answers the routing decision as JSON without forwarding.
func (s *Server) explain(x *exchange) {
	if x.m.pd != nil && x.m.pd.active() {
		s.explainPD(x)
		return
	}
	eps, retry, err := s.healthy(nil, x)
	if err != nil {
		s.noReplica(x, retry, err)
		return
	}
	d, err := s.decide(x, s.routeInput(x, names(eps), true))
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
		Model        string          `json:"model"`
		Replica      string          `json:"replica"`
		URL          string          `json:"url,omitempty"`
		CachedTokens int             `json:"cached_tokens"`
		PromptTokens int             `json:"prompt_tokens"`
		Tokenized    bool            `json:"tokenized"`
		Shadow       *ShadowDecision `json:"shadow,omitempty"`
		Explain      any             `json:"explain,omitempty"`
	}{x.req.Model, d.Replica, "", d.CachedTokens, len(x.tokens), x.tokens != nil, d.Shadow, d.Explain}
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
		message: fmt.Sprintf("no healthy replica for model %q", x.req.Model), retryAfter: max(retry, time.Second)}, outcomeNoReplica)
	x.err = err
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

// truncate returns s cut to at most n bytes (on a rune boundary), "..."
// marking a cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := n
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + "..."
}

// finish records the request's metrics and its one log line, then aborts
// the connection if the response broke after its first byte.
func (s *Server) finish(x *exchange) {
	// The label is a configured model or "unknown" (bounded cardinality:
	// a client cannot create series); the log line names what was asked.
	label, logged := modelUnknown, modelUnknown
	if x.asked != "" {
		logged = truncate(x.asked, 256)
		if _, ok := s.models[x.asked]; ok {
			label = x.asked
		} else if x.m != nil { // an adapter or alias: its group
			label = x.m.cfg.Name
		}
	}
	if x.outcome == "" {
		x.outcome = outcomeOK
	}
	s.observeRoute(x)
	s.bodies.give(x.bodyHeld)
	s.m.requests.WithLabelValues(label, x.replica, x.outcome).Inc()
	s.holds.Release(&x.held)
	lvl := slog.LevelInfo
	if x.status >= 500 || x.outcome == outcomeUpstream || x.outcome == outcomeTimeout {
		lvl = slog.LevelWarn
	}
	if s.log.Enabled(x.r.Context(), lvl) {
		attrs := []slog.Attr{
			slog.String("request_id", x.id), slog.String("model", logged),
			slog.String("replica", x.replica), slog.Int("status", x.status),
			slog.String("outcome", x.outcome), slog.Int("cached_tokens", x.cached),
			slog.Int("prompt_tokens", len(x.tokens)), slog.Int("retries", x.retries),
			slog.Float64("duration_ms", float64(s.deps.Now().Sub(x.start).Microseconds())/1000),
		}
		if x.prefill != "" {
			attrs = append(attrs, slog.String("prefill_replica", x.prefill))
		}
		if x.err != nil {
			attrs = append(attrs, slog.String("err", x.err.Error()))
		}
		s.log.LogAttrs(x.r.Context(), lvl, "request", attrs...)
	}
	s.endSpan(x)
	if x.abort {
		panic(http.ErrAbortHandler) // net/http's documented way to cut a response short
	}
}
