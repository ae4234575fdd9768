package admission

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"kvrouter/internal/config"
	"kvrouter/internal/fleet"
	"kvrouter/internal/frontmetrics"
	"kvrouter/internal/group"
	"kvrouter/internal/kvindex"
	"kvrouter/internal/request"
	"kvrouter/internal/routing"
	"kvrouter/internal/tokenizer"
	"kvrouter/internal/tracing"
)

// Deps are a Core's collaborators.
type Deps struct {
	// Fleet holds the engines of every configured model. Required.
	Fleet *fleet.Fleet
	// Metrics is the request metrics set both fronts share (registered by
	// the HTTP front); View is its front="http" view, whose decision and
	// tokenizer series count a request whose Flow names no other.
	// Required.
	Metrics *frontmetrics.Set
	View    *frontmetrics.Front
	// Tracing traces the tokenize and route steps. Required (a disabled
	// one records nothing).
	Tracing *tracing.Tracing
	// Refuse, when not nil, is the front's check of a request before its
	// features run (a client-set control field), given the request as
	// parsed from the client's body (before any Rewriter); its error
	// answers the request.
	Refuse func(req *request.Parsed) *request.Error
	// OnDecision, when not nil, is called with every routing decision of
	// Decide; it must not block.
	OnDecision func(model, requestID string, promptTokens int, d group.Decision)
	// Now is the clock. Required.
	Now func() time.Time
}

// Group is one configured model group as admission sees it. Built by the
// front once per group; read-only afterwards.
type Group struct {
	// Cfg is the group's configuration (config.Model).
	Cfg config.Model
	// Router chooses the group's engine for each request. Required.
	Router group.Router
	// Tok tokenizes the group's prompts; nil: tokenizer "none".
	Tok group.Tokenizer
	// Features are the group's per-request features, in the order they
	// run (doc.go).
	Features []Feature
}

// Core is the routing core: configuration, model groups, collaborators.
// Safe for concurrent use.
type Core struct {
	cfg    config.Config
	deps   Deps
	log    *slog.Logger
	groups map[string]*Group
}

// New builds a Core over groups (by name, one per cfg.Models entry) from
// a defaults-filled, validated cfg. It starts no goroutines.
func New(cfg config.Config, groups map[string]*Group, deps Deps, log *slog.Logger) *Core {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Core{cfg: cfg, deps: deps, log: log, groups: groups}
}

// Flow is one inference request's way through admission: what it asked
// for, its model group, the body to forward and the prompt's token ids.
// A front builds one per request (the HTTP front's exchange embeds it;
// the Picker keeps one per Pick). Not safe for concurrent use.
type Flow struct {
	// Ctx is the request's context (its trace span's), cancelled when the
	// client leaves.
	Ctx context.Context
	// ID is the request id (the client's x-request-id, or a new one).
	ID string
	// Start is when the front received the request (Deps.Now).
	Start time.Time
	// Header returns a client request header's first value ("" when
	// absent). Required.
	Header func(name string) string
	// Metrics is the front whose tokenizer series count the request: nil
	// for the HTTP front's (Deps.View).
	Metrics *frontmetrics.Front
	// Span is the request's trace span (nil or a no-op one when tracing
	// is off).
	Span trace.Span
	// Req is the request as its group serves it (after a Rewriter), set
	// by Admit once parsed and checked.
	Req   *request.Parsed
	Asked string // the model the body named, "" when it was not read
	// Group is the request's model group, set by Admit once the request
	// passed the checks before its features (nil until then).
	Group  *Group
	Fwd    []byte   // the body sent upstream
	Tokens []uint32 // nil when unknown
	// MM are the prompt's multimodal items from the engine's render
	// (mediakeys.go); Media is what its chat parts carry.
	MM    []kvindex.MMItem
	Media request.Media
	// Plug, when not nil, is called by Admit once per feature of g, as
	// soon as that feature's first stage passed (its Rewrite for a
	// Rewriter, else its Admit), for the front to plug its own stages of
	// f in.
	Plug func(ctx context.Context, f Feature, g *Group)

	// route completes the router's input (AddRoute); nil: nothing.
	route func(in *group.RouteInput)
	// memo links memoIDs, the ids the tokenizer returned, to its prefix
	// cache, where the router keeps their block keys (nil: none).
	memo    *tokenizer.PrefixMemo
	memoIDs []uint32
}

// noHeader is the header of a request without headers.
func noHeader(string) string { return "" }

// Admit parses body as a request of kind k, resolves its model group
// (Lookup), runs the group's features (doc.go), checks it, builds the
// body to forward and tokenizes the prompt, filling in x. The error is
// the answer to give instead (outcome bad_request).
func (s *Core) Admit(ctx context.Context, x *Flow, k request.Kind, body []byte) *request.Error {
	x.route, x.memo, x.memoIDs = nil, nil, nil
	req, e := request.Parse(k, body)
	sent := req // as the client sent it, for Refuse
	if req != nil {
		x.Asked = req.Model
	}
	var g *Group
	if e == nil {
		g = s.Lookup(req.Model)
	}
	plug := func(f Feature) {
		if x.Plug != nil {
			x.Plug(ctx, f, g)
		}
	}
	if g != nil {
		for _, f := range g.Features {
			if r, ok := f.(Rewriter); ok && e == nil {
				if req, e = r.Rewrite(ctx, x, g, req, body); e == nil {
					plug(f)
				}
			}
		}
	}
	if e == nil && s.deps.Refuse != nil {
		e = s.deps.Refuse(sent)
	}
	if e != nil {
		return e
	}
	x.Req = req
	if g == nil {
		return &request.Error{Type: request.UnknownModel, Param: "model",
			Message: fmt.Sprintf("The model `%s` does not exist.", Truncate(req.Model, MaxEcho))}
	}
	x.Group = g
	x.Media = req.Media()
	for _, f := range g.Features {
		if e := f.Admit(ctx, x); e != nil {
			return e
		}
		if _, ok := f.(Rewriter); !ok { // a Rewriter's were plugged after Rewrite
			plug(f)
		}
	}
	fwd, err := req.ForwardBody(!g.Cfg.DisableHitReport)
	if err != nil {
		return request.Invalid("", err.Error())
	}
	x.Fwd = fwd
	x.Tokens = s.tokenize(ctx, x)
	return nil
}

// Lookup is the model group serving name: the group with an alias of that
// name, the group called so, or the one with a LoRA adapter of that name
// (configured, or listed by its engines with the group's name as parent);
// nil for none.
func (s *Core) Lookup(name string) *Group {
	if _, g := s.Alias(name); g != nil {
		return g
	}
	if g, ok := s.groups[name]; ok {
		return g
	}
	return s.AdapterGroup(name)
}

// AdapterGroup returns the group serving LoRA adapter name: the group
// that configures it, else one whose engines list it with the group's
// name as parent; nil for none.
func (s *Core) AdapterGroup(name string) *Group {
	for _, g := range s.groups {
		for _, a := range g.Cfg.Adapters {
			if a.Name == name {
				return g
			}
		}
	}
	for _, ep := range s.deps.Fleet.All() {
		if parent, ok := ep.AdapterParent(name); ok {
			if g, ok := s.groups[parent]; ok {
				return g
			}
		}
	}
	return nil
}

// Alias returns the route alias called name and its group, or nil.
func (s *Core) Alias(name string) (*config.Alias, *Group) {
	for _, g := range s.groups {
		if al := g.Alias(name); al != nil {
			return al, g
		}
	}
	return nil, nil
}

// Alias is g's route alias called name, or nil.
func (g *Group) Alias(name string) *config.Alias {
	for i := range g.Cfg.Aliases {
		if g.Cfg.Aliases[i].Name == name {
			return &g.Cfg.Aliases[i]
		}
	}
	return nil
}

// tokenize returns the prompt's token ids, or nil (route by load) when the
// tokenizer is "none" or fails: a tokenizer problem never fails a request.
func (s *Core) tokenize(ctx context.Context, x *Flow) []uint32 {
	req := x.Req
	if req.PromptTokens != nil {
		return req.PromptTokens
	}
	if x.Group.Tok == nil {
		return nil
	}
	t0 := time.Now()
	ctx, span := s.startChild(ctx, spanTokenize)
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
		ids, mm, x.memo, err = chatTokens(ctx, x.Group.Tok, creq, body)
		x.memoIDs = ids
	} else {
		ids, mm, err = group.TokensMM(ctx, x.Group.Tok, chat, body, req.PromptText)
	}
	x.MM = mm
	tm := s.deps.View
	if x.Metrics != nil {
		tm = x.Metrics
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
			s.log.Debug("tokenize failed, routing by load", "request_id", x.ID, "model", req.Model, "err", err)
		}
		return nil
	}
	return ids
}

// MaxModelLen is the context length, in tokens, of model's engines as
// the fleet last read it from their GET /v1/models cards (vLLM's ModelCard
// max_model_len; fleet.Endpoint.MaxModelLen): the largest of them, so the
// router never refuses what some engine accepts; 0 while none is known.
func (s *Core) MaxModelLen(model string) int {
	n := 0
	for _, ep := range s.deps.Fleet.Endpoints(model) {
		n = max(n, ep.MaxModelLen(model))
	}
	return n
}

// TooLong returns vLLM's 400 for a prompt of x.Tokens plus the requested
// output that does not fit the model's max_model_len, or nil. vLLM
// (renderers/params.py TokenizeParams._token_len_check) rejects a prompt
// longer than max_model_len minus the requested output tokens (a chat's
// max_completion_tokens, else max_tokens); without max_tokens it counts 0
// output tokens here (vLLM >= 0.18 counts a completion's default 16, and
// earlier versions refused a prompt of exactly max_model_len), so the
// router never refuses what an engine of any version accepts. Unknown
// tokens or an unknown max_model_len: nil (the engine decides).
func (s *Core) TooLong(_ context.Context, x *Flow) *request.Error {
	if x.Group.Cfg.TooLong != config.TooLongReject || x.Tokens == nil {
		return nil
	}
	limit := s.MaxModelLen(x.Group.Cfg.Name)
	prompt, out := len(x.Tokens), x.Req.OutputTokens
	if limit <= 0 || prompt+out <= limit {
		return nil
	}
	return &request.Error{Type: request.PromptTooLong, Param: "input_tokens",
		Message: fmt.Sprintf("This model's maximum context length is %d tokens. However, you requested %d output tokens and your prompt contains %d input tokens, for a total of %d tokens. Please reduce the length of the input prompt or the number of requested output tokens. (parameter=input_tokens, value=%d)",
			limit, out, prompt, prompt+out, prompt)}
}

// keyMemo is x's link to the tokenizer's prefix cache for the router, nil
// unless x.Tokens are still the very ids the tokenizer returned with it.
func keyMemo(x *Flow) routing.KeyMemo {
	if x.memo == nil || len(x.Tokens) == 0 || len(x.Tokens) != len(x.memoIDs) || &x.Tokens[0] != &x.memoIDs[0] {
		return nil
	}
	return x.memo
}

// bytesPerToken bounds a prompt's length in tokens from its body when its
// tokens are unknown (no tokenizer, or a prompt the tokenizer could not
// encode): a byte-level BPE token covers at least one byte of text, and
// the body's JSON framing outweighs the few tokens a chat template adds,
// so the body's size in bytes is an upper bound (about 4x for English
// text on a real tokenizer; exact for engine-sim, which counts a byte as
// a token). It is the prefill the router counts on the replica and the
// basis of the predicted time to first token, which sets how long the
// fleet's stall detector waits for a first byte (fleet.Endpoint.Await):
// an estimate below the engine's count makes a live engine that is busy
// prefilling look stalled, one above it only delays declaring a real
// stall.
const bytesPerToken = 1

// RouteInput builds the router's input for x among the engines named
// cands (dry: a decision that takes no lease).
func (s *Core) RouteInput(_ context.Context, x *Flow, cands []string, dry bool) *group.RouteInput {
	in := &group.RouteInput{
		Model:      x.Req.Model,
		RequestID:  x.ID,
		Tokens:     x.Tokens,
		CacheSalt:  x.Req.CacheSalt,
		KeyMemo:    keyMemo(x),
		MaxTokens:  x.Req.MaxTokens,
		Candidates: cands,
		DryRun:     dry,
	}
	if x.route != nil {
		x.route(in)
	}
	mediaRouteInput(x, in)
	if in.Tokens == nil && in.PromptTokens == 0 {
		in.PromptTokens = len(x.Fwd) / bytesPerToken
	}
	if tr, ok := x.Group.Router.(textRouter); ok && tr.UsesText() {
		in.Text = x.Req.RoutingText()
	}
	for _, h := range x.Group.Cfg.SessionHeaders {
		if v := x.Header(h); v != "" {
			in.Session = v
			break
		}
	}
	return in
}

// Decide asks the group's router, timing the decision
// (kvrouter_proxy_decision_seconds, front="http").
func (s *Core) Decide(ctx context.Context, x *Flow, in *group.RouteInput) (group.Decision, error) {
	t0 := time.Now()
	_, span := s.startChild(ctx, spanRoute)
	d, err := x.Group.Router.Route(in)
	s.deps.View.Decision.WithLabelValues(x.Req.Model).Observe(time.Since(t0).Seconds())
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	} else {
		span.SetAttributes(attribute.String(attrReplica, d.Replica), attribute.Int(attrCached, d.CachedTokens),
			attribute.Int("kvrouter.candidate_count", len(in.Candidates)))
	}
	span.End()
	if err == nil && s.deps.OnDecision != nil {
		s.deps.OnDecision(x.Req.Model, x.ID, len(x.Tokens), d)
	}
	return d, err
}

// Span names and attribute keys of admission's steps (docs/serve.md,
// "Tracing"), as the HTTP front names its own.
const (
	spanTokenize     = "kvrouter.tokenize"
	spanRoute        = "kvrouter.route"
	attrPromptTokens = "gen_ai.usage.input_tokens"
	attrReplica      = "kvrouter.replica"
	attrCached       = "kvrouter.predicted_cached_tokens"
)

// startChild starts an internal span named name under ctx's span.
func (s *Core) startChild(ctx context.Context, name string) (context.Context, trace.Span) {
	return s.deps.Tracing.Provider.Tracer(TracerName).Start(ctx, name, trace.WithSpanKind(trace.SpanKindInternal))
}

// TracerName is the instrumentation scope of both fronts' spans.
const TracerName = "kvrouter/internal/proxy"
