package proxy

import (
	"context"
	"errors"
	"fmt"
	"kvrouter/internal/config"
	"kvrouter/internal/group"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"kvrouter/internal/frontmetrics"
	"kvrouter/internal/kvindex"
	"kvrouter/internal/request"
	"kvrouter/internal/tracing"
)

// The routing core: the per-request steps both fronts share, free of
// net/http. A request is parsed (package request), resolved to its model
// group (by name, alias or LoRA adapter), run through the group's features
// (feature.go), given the body to forward and tokenized (admit); then
// routed, as often as its front asks (routeInput, decide). The HTTP front
// (handle.go, forward.go, relay.go) forwards and relays; the endpoint
// picker (picker.go) hands the decision to a gateway. Errors before
// routing are *request.Error values, which each front answers in its own
// way. The core sits beside the model group's types it routes with
// (Router, RouteInput, Decision, Tokenizer, model); it imports no
// net/http, so it moves with them.

// core is the state the routing core reads: configuration, model groups,
// collaborators and metrics. A Server embeds it.
type core struct {
	cfg    config.Config
	deps   Deps
	log    *slog.Logger
	m      *metrics
	models map[string]*model
	tr     *tracing.Tracing
	lm     *listenerMetrics
	fm     *featureMetrics
}

// flow is one inference request's way through the routing core: what it
// asked for, its model group, the body to forward and the prompt's token
// ids. The HTTP front's exchange embeds one; the endpoint picker keeps one
// per Pick. Not safe for concurrent use.
type flow struct {
	// ctx is the request's context (its trace span's), cancelled when the
	// client leaves.
	ctx   context.Context
	id    string
	start time.Time
	// header returns a client request header's first value ("" when
	// absent).
	header func(name string) string
	// front is the front whose tokenizer series count the request: nil
	// for the HTTP front's own, the EPP's view for a Picker's.
	front *frontmetrics.Front
	// span is the request's trace span (nil or a no-op one when tracing is
	// off).
	span   trace.Span
	req    *request.Parsed
	asked  string // the model the body named, "" when it was not read
	m      *model
	fwd    []byte   // the body sent upstream
	tokens []uint32 // nil when unknown
	// mm are the prompt's multimodal items from the engine's render
	// (mediakeys.go); media is what its chat parts carry.
	mm    []kvindex.MMItem
	media request.Media
	// hooks are the request's stages plugged in by its group's features
	// (feature.go).
	hooks hooks
}

// noHeader is the header of a request without headers.
func noHeader(string) string { return "" }

// admit parses body as a request of kind k, resolves its model group
// (group), runs the group's features (feature.go),
// checks it, builds the body to forward and tokenizes the prompt, filling
// in f. The error is the answer to give instead (outcome bad_request).
func (s *core) admit(ctx context.Context, x *flow, k request.Kind, body []byte) *request.Error {
	x.hooks = newHooks(x)
	req, e := request.Parse(k, body)
	if req != nil {
		x.asked = req.Model
	}
	var m *model
	if e == nil {
		m = s.group(req.Model)
	}
	if m != nil {
		for _, f := range m.features {
			if r, ok := f.(rewriter); ok && e == nil {
				req, e = r.rewrite(ctx, x, m, req, body)
			}
		}
	}
	if e == nil {
		e = s.refuseClientControls(body)
	}
	if e != nil {
		return e
	}
	x.req = req
	if m == nil {
		return &request.Error{Type: request.UnknownModel, Param: "model",
			Message: fmt.Sprintf("The model `%s` does not exist.", truncate(req.Model, maxEcho))}
	}
	x.m = m
	x.media = req.Media()
	for _, f := range m.features {
		if e := f.admit(ctx, x); e != nil {
			return e
		}
	}
	fwd, err := req.ForwardBody(!m.cfg.DisableHitReport)
	if err != nil {
		return request.Invalid("", err.Error())
	}
	x.fwd = fwd
	x.tokens = s.tokenize(ctx, x)
	return nil
}

// group is the model group serving name: the group called so, the one
// with an alias or a LoRA adapter of that name, or nil.
func (s *core) group(name string) *model {
	if _, m := s.alias(name); m != nil {
		return m
	}
	if m, ok := s.models[name]; ok {
		return m
	}
	if m, ok := s.adapterModel(name); ok {
		return m
	}
	return nil
}

// tokenize returns the prompt's token ids, or nil (route by load) when the
// tokenizer is "none" or fails: a tokenizer problem never fails a request.
func (s *core) tokenize(ctx context.Context, x *flow) []uint32 {
	req := x.req
	if req.PromptTokens != nil {
		return req.PromptTokens
	}
	if x.m.tok == nil {
		return nil
	}
	t0 := time.Now()
	ctx, span := s.startChild(ctx, spanTokenize, trace.SpanKindInternal)
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
		ids, mm, err = chatTokens(ctx, x.m.tok, creq, body)
	} else {
		ids, mm, err = group.TokensMM(ctx, x.m.tok, chat, body, req.PromptText)
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
		if errors.Is(err, group.ErrNoTokenizerEngine) {
			tm.TokenizerUnavailable.WithLabelValues(req.Model).Inc()
		}
		if s.log.Enabled(ctx, slog.LevelDebug) {
			s.log.Debug("tokenize failed, routing by load", "request_id", x.id, "model", req.Model, "err", err)
		}
		return nil
	}
	return ids
}

// maxModelLen is the context length, in tokens, of model's engines as
// the fleet last read it from their GET /v1/models cards (vLLM's ModelCard
// max_model_len; fleet.Endpoint.MaxModelLen): the largest of them, so the
// router never refuses what some engine accepts; 0 while none is known.
func (s *core) maxModelLen(model string) int {
	n := 0
	for _, ep := range s.deps.Fleet.Endpoints(model) {
		n = max(n, ep.MaxModelLen(model))
	}
	return n
}

// tooLong returns vLLM's 400 for a prompt of x.tokens plus the requested
// output that does not fit the model's max_model_len, or nil. vLLM
// (renderers/params.py TokenizeParams._token_len_check) rejects a prompt
// longer than max_model_len minus the requested output tokens (a chat's
// max_completion_tokens, else max_tokens); without max_tokens it counts 0
// output tokens here (vLLM >= 0.18 counts a completion's default 16, and
// earlier versions refused a prompt of exactly max_model_len), so the
// router never refuses what an engine of any version accepts. Unknown
// tokens or an unknown max_model_len: nil (the engine decides).
func (s *core) tooLong(x *flow) *request.Error {
	if x.m.cfg.TooLong != config.TooLongReject || x.tokens == nil {
		return nil
	}
	limit := s.maxModelLen(x.m.cfg.Name)
	prompt, out := len(x.tokens), x.req.OutputTokens
	if limit <= 0 || prompt+out <= limit {
		return nil
	}
	return &request.Error{Type: request.PromptTooLong, Param: "input_tokens",
		Message: fmt.Sprintf("This model's maximum context length is %d tokens. However, you requested %d output tokens and your prompt contains %d input tokens, for a total of %d tokens. Please reduce the length of the input prompt or the number of requested output tokens. (parameter=input_tokens, value=%d)",
			limit, out, prompt, prompt+out, prompt)}
}

// routeInput builds the router's input for x, excluding tried replicas.
func (s *core) routeInput(x *flow, cands []string, dry bool) *group.RouteInput {
	in := &group.RouteInput{
		Model:      x.req.Model,
		RequestID:  x.id,
		Tokens:     x.tokens,
		CacheSalt:  x.req.CacheSalt,
		MaxTokens:  x.req.MaxTokens,
		Candidates: cands,
		DryRun:     dry,
	}
	x.hooks.route(in)
	mediaRouteInput(x, in)
	if tr, ok := x.m.router.(textRouter); ok && tr.UsesText() {
		in.Text = x.req.RoutingText()
	}
	for _, h := range x.m.cfg.SessionHeaders {
		if v := x.header(h); v != "" {
			in.Session = v
			break
		}
	}
	return in
}

// decide asks the model's router, timing the decision.
func (s *core) decide(x *flow, in *group.RouteInput) (group.Decision, error) {
	t0 := time.Now()
	_, span := s.startChild(x.ctx, spanRoute, trace.SpanKindInternal)
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
