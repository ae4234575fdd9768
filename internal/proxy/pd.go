package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"

	"kvrouter/internal/admission"
	"kvrouter/internal/fleet"
	"kvrouter/internal/group"
	"kvrouter/internal/pd"
	"kvrouter/internal/request"
)

// Disaggregated prefill and decode (P/D) is a routing decision of the same
// handler: for a model group whose engines have roles, forward first plans
// the request's path (planPD), then either sends it whole to a decode
// engine (path local: the decode engine prefills), whole to a prefill
// engine (path whole: pd.Rule's third path, no kv_transfer_params, no
// transfer), or runs two legs, as
// vLLM's NixlConnector proxy does (tests/v1/kv_connector/nixl_integration/
// toy_proxy_server.py at vllm-project/vllm e009930 and main;
// docs/features/nixl_connector_usage.md at 026c83f):
//
//  1. prefill leg, on the prefill engine the kv policy picks over the
//     prefill pool: the client's body with stream false, max_tokens 1
//     (and max_completion_tokens 1 when given), no stream_options or
//     min_tokens, and kv_transfer_params {do_remote_decode: true,
//     do_remote_prefill: false, remote_*: null}; answered whole, its
//     kv_transfer_params (do_remote_prefill: true, remote_engine_id,
//     remote_block_ids, remote_host, remote_port, ...) are kept verbatim;
//  2. decode leg, on the decode engine with the least decode load (routed
//     without token ids: the decode engine does not prefill, and the
//     blocks it pulls come back as its own BlockStored events): the
//     client's own body with those kv_transfer_params, streamed or not,
//     relayed exactly as a plain request (forward, try, relay).
//
// Headers of the decode leg are built from the client's request like any
// engine request (outHeaders: hop-by-hop and credentials stripped); the
// prefill engine's response headers are dropped, so nothing hop-by-hop
// crosses from one leg to the other. A failed prefill leg (error status,
// connection, timeout, no kv_transfer_params) is answered at once with
// OpenAI's error JSON and no decode leg is sent. A decode leg that fails
// before its first byte with a connection error or 429/502/503 is retried
// on another decode engine with the same kv_transfer_params (Retries): the
// prefill engine keeps the blocks until a decode engine reads them or its
// lease (kv_lease_duration, 30 s) ends, and an engine that refused the
// request read nothing. Each leg holds its own load lease, released once
// on every path.

// pdPick is one pool's dry-run choice.
type pdPick struct {
	Replica      string `json:"replica"`
	CachedTokens int    `json:"cached_tokens"`
	Explain      any    `json:"explain,omitempty"`
}

// pdPlan is a request's path and the record of why.
type pdPlan struct {
	Path    string     `json:"path"`
	Verdict pd.Verdict `json:"verdict"`
	// Prefill is the prefill pool's choice (empty on the local path when
	// the rule did not need it); Decode the decode pool's for a local
	// prefill (cache and load: the engine whose cache the rule weighed).
	Prefill *pdPick `json:"prefill,omitempty"`
	Decode  *pdPick `json:"decode,omitempty"`
}

// planPD decides x's path over the healthy prefill and decode engines
// (decode not empty), by dry runs of the router over each pool and the
// group's rule.
func (s *Server) planPD(x *exchange, prefill, decode []string) (pdPlan, error) {
	rule := &x.m.pd.rule
	var p pdPlan
	dd, err := s.dryRoute(x, decode)
	if err != nil {
		return p, err
	}
	p.Decode = &dd
	switch {
	case len(prefill) == 0:
		p.Path, p.Verdict.Reason = pathLocal, reasonNoPrefill
		return p, nil
	case rule.Mode == pd.ModeNever:
		p.Path, p.Verdict.Reason = pathLocal, pd.ReasonNever
		return p, nil
	case parallelSampling(x.Req.Body):
		p.Path, p.Verdict.Reason = pathLocal, reasonParallelSampling
		return p, nil
	}
	pp, err := s.dryRoute(x, prefill)
	if err != nil {
		return p, err
	}
	p.Prefill = &pp
	if x.Tokens == nil && rule.Mode == pd.ModeConditional {
		p.Path, p.Verdict = pathDisaggregated, pd.Verdict{Remote: true, Reason: reasonPromptUnknown}
		return p, nil
	}
	in := pd.Inputs{UncachedTokens: max(len(x.Tokens)-dd.CachedTokens, 0), DecodePrefillRate: 10000}
	if lr, ok := x.m.Router.(loadReporter); ok {
		if l, ok := lr.Load(dd.Replica); ok && l.PrefillRate > 0 {
			in.DecodePrefillRate = l.PrefillRate
			in.DecodeQueueSeconds = float64(l.QueuedPrefill) / l.PrefillRate
		}
		if l, ok := lr.Load(dd.Replica); ok {
			in.DecodeInFlight = int(l.InFlight)
		}
		if l, ok := lr.Load(pp.Replica); ok && l.PrefillRate > 0 {
			in.PrefillQueueSeconds = float64(l.QueuedPrefill) / l.PrefillRate
			in.PrefillPrefillRate = l.PrefillRate
		}
		if l, ok := lr.Load(pp.Replica); ok {
			in.PrefillInFlight = int(l.InFlight)
		}
	}
	p.Verdict = rule.Decide(in)
	switch {
	case p.Verdict.Remote:
		p.Path = pathDisaggregated
	case p.Verdict.Whole:
		p.Path = pathWhole
	default:
		p.Path = pathLocal
	}
	return p, nil
}

// dryRoute is the router's choice among cands without recording it.
func (s *Server) dryRoute(x *exchange, cands []string) (pdPick, error) {
	d, err := s.core.Decide(x.Ctx, &x.Flow, s.core.RouteInput(x.Ctx, &x.Flow, cands, true))
	if err != nil {
		return pdPick{}, err
	}
	if d.Release != nil {
		d.Release()
	}
	return pdPick{Replica: d.Replica, CachedTokens: d.CachedTokens, Explain: d.Explain}, nil
}

// planHealthy plans x over its group's healthy prefill and decode engines
// and returns the plan and the prefill pool; false when x has been answered
// (503 without a healthy decode engine, 500 on a routing error).
func (s *Server) planHealthy(x *exchange) (pdPlan, []string, bool) {
	eps, retry, err := s.deps.Fleet.Healthy(nil, x.Req.Model)
	prefill, decode := x.m.pd.split(eps)
	if len(decode) == 0 {
		if err == nil {
			err = fmt.Errorf("no healthy decode engine: %w", fleet.ErrNoEndpoint)
		}
		s.noReplica(x, retry, err)
		return pdPlan{}, nil, false
	}
	plan, err := s.planPD(x, prefill, decode)
	if err != nil {
		s.fail(x, serverError("routing: "+err.Error()), outcomeUpstream)
		return pdPlan{}, nil, false
	}
	return plan, prefill, true
}

// pdFeature runs a P/D group's requests (hooks plan and explain): the
// plan, then the local path or the two legs.
type pdFeature struct {
	s *Server
	g *pdGroup
}

// Admit does nothing: the P/D legs are the HTTP front's (plug).
func (pdFeature) Admit(context.Context, *admission.Flow) *request.Error { return nil }

// plug plugs the P/D plan and explanation in.
func (f pdFeature) plug(_ context.Context, x *exchange, _ *model) {
	x.hooks.addPlan(f.plan)
	x.hooks.explain = func(_ context.Context, x *exchange) bool {
		if !f.g.active() {
			return false
		}
		f.s.explainPD(x)
		return true
	}
}

// plan serves x in a P/D group while the group has roles: plan, then
// narrow the attempts to the decode pool (the local path) or the prefill
// pool (the whole path), or run the prefill leg and send the decode leg
// with its kv_transfer_params, routed by load. False when x was answered.
func (f pdFeature) plan(ctx context.Context, x *exchange) bool {
	s, g := f.s, f.g
	if !g.active() {
		return true
	}
	if e := s.core.TooLong(ctx, &x.Flow); e != nil {
		s.fail(x, requestError(e), outcomeBadRequest)
		return false
	}
	plan, prefill, ok := s.planHealthy(x)
	if !ok {
		return false
	}
	s.pdm.requests.WithLabelValues(x.Req.Model, plan.Path, plan.Verdict.Reason).Inc()
	x.w.Header().Set("X-Kvrouter-Path", plan.Path)
	switch plan.Path {
	case pathLocal:
		x.hooks.addEngines(g.keep(g.isDecode))
		return true
	case pathWhole:
		// A plain request on the prefill pool (no kv_transfer_params): the
		// kv policy over it picks the engine the plan weighed, unless its
		// state changed meanwhile; a retry may go to another prefill engine.
		x.hooks.addEngines(g.keep(g.isPrefill))
		return true
	}
	params, ok := s.prefillLeg(ctx, x, prefill)
	if !ok {
		return false
	}
	body, err := withTransferParams(x.Fwd, params)
	if err != nil {
		s.fail(x, serverError("decode leg body: "+err.Error()), outcomeUpstream)
		return false
	}
	x.Fwd = body
	x.hooks.addEngines(g.keep(g.isDecode))
	x.AddRoute(func(in *group.RouteInput) { in.Tokens = nil })
	return true
}

// keep is an engines stage keeping the engines in role (isDecode,
// isPrefill).
func (g *pdGroup) keep(in func(name string) bool) func([]*fleet.Endpoint) ([]*fleet.Endpoint, error) {
	return func(eps []*fleet.Endpoint) ([]*fleet.Endpoint, error) {
		return slices.DeleteFunc(eps, func(ep *fleet.Endpoint) bool { return !in(ep.Name()) }), nil
	}
}

// prefillLeg runs the prefill leg on the prefill pool, retrying like
// forward while the failure allows, and returns the engine's
// kv_transfer_params; false when x has been answered (an error, or the
// client left).
func (s *Server) prefillLeg(ctx context.Context, x *exchange, pool []string) (json.RawMessage, bool) {
	body, err := prefillBody(x.Fwd)
	if err != nil {
		s.fail(x, serverError("prefill leg body: "+err.Error()), outcomeUpstream)
		return nil, false
	}
	var tried []string
	prefillReplica := "" // the last prefill leg's engine, for the log line
	for attempt := 0; ; attempt++ {
		cands := slices.DeleteFunc(slices.Clone(pool), func(n string) bool { return slices.Contains(tried, n) })
		if len(cands) == 0 {
			s.noReplica(x, time.Second, fmt.Errorf("every prefill engine tried: %w", fleet.ErrNoEndpoint))
			return nil, false
		}
		in := s.core.RouteInput(x.Ctx, &x.Flow, cands, false)
		in.MaxTokens = 1
		d, err := s.core.Decide(x.Ctx, &x.Flow, in)
		if err != nil {
			s.fail(x, serverError("routing: "+err.Error()), outcomeUpstream)
			return nil, false
		}
		ep := s.deps.Fleet.Endpoint(d.Replica)
		if ep == nil || !slices.Contains(cands, d.Replica) {
			if d.Release != nil {
				d.Release()
			}
			s.fail(x, serverError(fmt.Sprintf("router chose unknown replica %q", d.Replica)), outcomeUpstream)
			return nil, false
		}
		tried = append(tried, d.Replica)
		x.replica = d.Replica // the decode leg's choice replaces it
		if attempt == 0 {
			x.hooks.addEnd(func(x *exchange, attrs []slog.Attr) []slog.Attr {
				return append(attrs, slog.String("prefill_replica", prefillReplica))
			})
		}
		prefillReplica = d.Replica
		x.w.Header().Set("X-Kvrouter-Prefill-Replica", d.Replica)
		x.w.Header().Set("X-Kvrouter-Prefill-Cached-Tokens", strconv.Itoa(d.CachedTokens))
		params, retry := s.prefillTry(ctx, x, ep, d, body, attempt < x.m.Cfg.Retries)
		if params != nil {
			return params, true
		}
		if !retry {
			return nil, false
		}
		x.retries++
	}
}

// prefillTry sends one prefill leg to ep. It returns the transfer
// parameters, or nil and whether to retry elsewhere (only when canRetry);
// on nil without retry, x is answered.
func (s *Server) prefillTry(ctx context.Context, x *exchange, ep *fleet.Endpoint, d group.Decision, body []byte, canRetry bool) (params json.RawMessage, retry bool) {
	if d.Release != nil {
		defer d.Release()
	}
	defer func() {
		if params == nil && d.Failed != nil {
			d.Failed()
		}
	}()
	ctx, wd, end := s.startAttempt(ctx, x, ep, d.PredictedTTFT)
	defer end()
	model := x.Req.Model
	failure := func(cause string, e *apiError, outcome string, err error) (json.RawMessage, bool) {
		s.pdm.prefillFailures.WithLabelValues(model, cause).Inc()
		if e != nil {
			s.fail(x, e, outcome)
		} else {
			x.status, x.outcome = 499, outcome
		}
		x.err = fmt.Errorf("prefill replica %s: %w", ep.Name(), err)
		return nil, false
	}

	t0 := time.Now()
	legCtx, leg := s.startLeg(ctx, x, ep)
	leg.SetAttributes(attribute.String("kvrouter.pd_leg", "prefill"))
	legStatus := 0
	defer func() {
		var err error
		if params == nil {
			err = x.err
		}
		endLeg(leg, legStatus, false, err)
	}()
	req, err := http.NewRequestWithContext(legCtx, http.MethodPost, ep.URL()+x.Req.Kind.Path(), bytes.NewReader(body))
	if err != nil {
		return failure("conn_error", serverError(err.Error()), outcomeUpstream, err)
	}
	outHeaders(req.Header, x.r.Header, x.ID, ep.APIKey())
	s.tr.Propagator.Inject(legCtx, propagation.HeaderCarrier(req.Header))
	req.ContentLength = int64(len(body))
	resp, err := x.m.transport.RoundTrip(req)
	if err == nil {
		legStatus = resp.StatusCode
		defer resp.Body.Close()
		var b []byte
		b, err = io.ReadAll(io.LimitReader(resp.Body, maxPrefillAnswer))
		if err == nil {
			wd.progress(time.Now())
			return s.prefillAnswer(x, ep, resp, b, canRetry, failure, t0)
		}
	}
	switch cause := context.Cause(ctx); {
	case x.r.Context().Err() != nil:
		return failure("client_closed", nil, outcomeClientClosed, err)
	case errors.Is(cause, errFirstByteTimeout) || errors.Is(cause, errIdleTimeout):
		return failure("timeout", &apiError{status: http.StatusGatewayTimeout, typ: typeServer,
			message: fmt.Sprintf("prefill replica %s did not answer within %v (request id %s)", ep.Name(), x.m.Cfg.Timeouts.FirstByte, x.ID)}, outcomeTimeout, cause)
	}
	s.deps.Fleet.Report(ep, fleet.OutcomeOfError(err))
	if canRetry {
		s.m.retries.WithLabelValues(model, "conn_error").Inc()
		return nil, true
	}
	return failure("conn_error", &apiError{status: http.StatusBadGateway, typ: typeServer,
		message: fmt.Sprintf("prefill replica %s could not be reached (request id %s)", ep.Name(), x.ID)}, outcomeUpstream, err)
}

// maxPrefillAnswer bounds a prefill leg's answer: one token and the block
// ids (8 bytes or so per block: 128K tokens in blocks of 16 are ~64 KiB).
const maxPrefillAnswer = 8 << 20

// prefillAnswer reads a prefill engine's whole answer b.
func (s *Server) prefillAnswer(x *exchange, ep *fleet.Endpoint, resp *http.Response, b []byte, canRetry bool,
	failure func(string, *apiError, string, error) (json.RawMessage, bool), t0 time.Time) (json.RawMessage, bool) {
	status := resp.StatusCode
	s.deps.Fleet.Report(ep, fleet.OutcomeOf(status))
	if status/100 != 2 {
		if canRetry && (status == http.StatusTooManyRequests || status == http.StatusBadGateway || status == http.StatusServiceUnavailable) {
			s.m.retries.WithLabelValues(x.Req.Model, "status_"+strconv.Itoa(status)).Inc()
			return nil, true
		}
		err := fmt.Errorf("status %d", status)
		if status/100 == 4 {
			// The engine's own answer to the client's request (vLLM's
			// OpenAI error JSON): relayed, no decode leg.
			s.pdm.prefillFailures.WithLabelValues(x.Req.Model, "status").Inc()
			h := x.w.Header()
			h.Set("Content-Type", "application/json")
			x.w.WriteHeader(status)
			_, _ = x.w.Write(b)
			x.status, x.outcome, x.err = status, outcomeEngineError, fmt.Errorf("prefill replica %s: %w", ep.Name(), err)
			return nil, false
		}
		return failure("status", &apiError{status: http.StatusBadGateway, typ: typeServer,
			message: fmt.Sprintf("prefill replica %s failed with status %d (request id %s)", ep.Name(), status, x.ID)}, outcomeEngineError, err)
	}
	var out struct {
		KVTransferParams json.RawMessage `json:"kv_transfer_params"`
	}
	if err := json.Unmarshal(b, &out); err != nil || isNull(out.KVTransferParams) || len(out.KVTransferParams) == 0 || out.KVTransferParams[0] != '{' {
		return failure("no_transfer_params", &apiError{status: http.StatusBadGateway, typ: typeServer,
			message: fmt.Sprintf("prefill replica %s answered without kv_transfer_params (is it started with --kv-transfer-config and NixlConnector?) (request id %s)", ep.Name(), x.ID)},
			outcomeUpstream, errors.New("no kv_transfer_params"))
	}
	s.pdm.prefillSeconds.WithLabelValues(x.Req.Model).Observe(time.Since(t0).Seconds())
	return out.KVTransferParams, false
}

// remoteDecodeParams asks the prefill engine to keep the KV for a remote
// decode (the toy proxy's request fields).
var remoteDecodeParams = json.RawMessage(`{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`)

// prefillBody is the prefill leg's body made from the client's: stream
// false, max_tokens 1 (max_completion_tokens 1 when present), no
// stream_options or min_tokens (min_tokens > max_tokens is refused), and
// kv_transfer_params asking for a remote decode.
func prefillBody(fwd []byte) ([]byte, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(fwd, &top); err != nil {
		return nil, err
	}
	one := json.RawMessage("1")
	top["stream"] = json.RawMessage("false")
	top["max_tokens"] = one
	if _, ok := top["max_completion_tokens"]; ok {
		top["max_completion_tokens"] = one
	}
	delete(top, "stream_options")
	delete(top, "min_tokens")
	top["kv_transfer_params"] = remoteDecodeParams
	return json.Marshal(top)
}

// withTransferParams is the decode leg's body: the client's own fields
// with the prefill engine's kv_transfer_params, verbatim.
func withTransferParams(fwd []byte, params json.RawMessage) ([]byte, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(fwd, &top); err != nil {
		return nil, err
	}
	top["kv_transfer_params"] = params
	return json.Marshal(top)
}

// explainPD answers POST /v1/route for a P/D group: the plan, both pools'
// choices and the rule's terms.
func (s *Server) explainPD(x *exchange) {
	plan, _, ok := s.planHealthy(x)
	if !ok {
		return
	}
	out := struct {
		Model        string `json:"model"`
		PromptTokens int    `json:"prompt_tokens"`
		Tokenized    bool   `json:"tokenized"`
		pdPlan
		Link          string  `json:"link"`
		BytesPerToken float64 `json:"kv_bytes_per_token"`
	}{x.Req.Model, len(x.Tokens), x.Tokens != nil, plan, x.m.pd.rule.Link, x.m.pd.rule.Model.BytesPerToken()}
	b, err := json.Marshal(out)
	if err != nil {
		s.fail(x, serverError("encoding decision: "+err.Error()), outcomeUpstream)
		return
	}
	h := x.w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Kvrouter-Path", plan.Path)
	if plan.Decode != nil {
		x.replica = plan.Decode.Replica
	}
	x.w.WriteHeader(http.StatusOK)
	_, _ = x.w.Write(b)
	x.status, x.outcome = http.StatusOK, outcomeRouteOnly
}

// parallelSampling reports whether body asks for several samples of its
// prompt (n or best_of above 1). Such a request takes the local path in
// every mode: a prefill leg's answer carries one kv_transfer_params (vLLM's
// CompletionResponse and ChatCompletionResponse have a single field, and
// the NixlConnector hands over one request's blocks), so the n samples vLLM
// fans out on the prefill engine cannot all be handed to the decode engine.
// A field of the wrong type is left to the engine to refuse.
func parallelSampling(body []byte) bool {
	var w struct {
		N      json.RawMessage `json:"n"`
		BestOf json.RawMessage `json:"best_of"`
	}
	if json.Unmarshal(body, &w) != nil {
		return false
	}
	for _, raw := range []json.RawMessage{w.N, w.BestOf} {
		var n float64
		if json.Unmarshal(raw, &n) == nil && n > 1 {
			return true
		}
	}
	return false
}
