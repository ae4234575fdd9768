package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"kvrouter/internal/fleet"
	"kvrouter/internal/request"
)

// Pass-through endpoints: vLLM's pooling, scoring and tokenizer endpoints
// (vllm/entrypoints/openai and vllm/entrypoints/serve: /v1/embeddings,
// /pooling, /classify, /score and /v1/score, /rerank, /v1/rerank and
// /v2/rerank, /tokenize, /detokenize) compute no KV cache worth routing
// for, so each request goes to the healthy engine of its model with the
// fewest requests in flight (ties: configuration order), its body
// unchanged except that a route alias's name becomes its group's. The body's
// "model" names the group (a model, adapter or alias; a body without one
// belongs to the only configured model). One other engine is tried after a
// connection error. The answer is relayed as it comes; errors before it are
// OpenAI-shaped.
var passthroughPaths = []string{
	"/v1/embeddings", "/pooling", "/classify",
	"/score", "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank",
	"/tokenize", "/detokenize",
}

func (s *Server) servePassthrough(w http.ResponseWriter, r *http.Request) {
	x := s.newExchange(w, r)
	defer s.finish(x)
	body, ok := s.readBody(x)
	if !ok {
		return
	}
	var probe struct {
		Model *string `json:"model"`
	}
	if err := json.Unmarshal(body, &probe); err != nil {
		s.fail(x, badRequest("", "request body must be a JSON object: "+err.Error()), outcomeBadRequest)
		return
	}
	name := ""
	if probe.Model != nil {
		name = *probe.Model
	} else if len(s.cfg.Models) == 1 {
		name = s.cfg.Models[0].Name
	} else {
		s.fail(x, badRequest("model", "model is required (kvrouter serves several models)"), outcomeBadRequest)
		return
	}
	x.Asked = name
	m, ok := s.models[name]
	adapter := "" // the LoRA adapter named, served by its base's engines that list it
	if !ok {
		if m, ok = s.adapterModel(name); ok {
			adapter = name
		}
	}
	if !ok {
		if al, am := s.alias(name); al != nil {
			m, ok = am, true
			var obj map[string]json.RawMessage
			if json.Unmarshal(body, &obj) == nil {
				obj["model"], _ = json.Marshal(am.Cfg.Name)
				body, _ = json.Marshal(obj)
			}
		}
	}
	if !ok {
		s.fail(x, &apiError{status: http.StatusNotFound, typ: typeNotFound, param: "model",
			message: fmt.Sprintf("The model `%s` does not exist.", truncate(name, maxEcho))}, outcomeBadRequest)
		return
	}
	x.m, x.Group, x.Req = m, m.Group, &request.Parsed{Model: m.Cfg.Name, Body: body}
	eps, retry, err := s.deps.Fleet.Healthy(nil, m.Cfg.Name)
	if adapter != "" {
		eps = slices.DeleteFunc(eps, func(ep *fleet.Endpoint) bool { return !ep.Listed(adapter) })
	}
	if len(eps) == 0 {
		if err == nil {
			err = fleet.ErrNoEndpoint
		}
		s.fail(x, &apiError{status: http.StatusServiceUnavailable, typ: typeServiceUnavailable,
			message: fmt.Sprintf("no healthy replica for model %q", name), retryAfter: max(retry, time.Second)}, outcomeNoReplica)
		x.err = err
		return
	}
	// Least in flight first; a stable sort keeps configuration order on ties.
	slices.SortStableFunc(eps, func(a, b *fleet.Endpoint) int { return int(a.InFlight() - b.InFlight()) })
	for i, ep := range eps[:min(len(eps), 2)] {
		x.replica = ep.Name()
		if !s.passOnce(x.Ctx, x, ep, body, i == 0 && len(eps) > 1) {
			return
		}
		x.retries++
	}
}

// passOnce sends body to ep and relays the answer; true when the caller
// should try another engine (a connection error, canRetry, nothing sent).
func (s *Server) passOnce(ctx context.Context, x *exchange, ep *fleet.Endpoint, body []byte, canRetry bool) bool {
	ctx, wd, end := s.startAttempt(ctx, x, ep, 0)
	defer end()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, ep.URL()+x.r.URL.Path, bytes.NewReader(body))
	if err != nil {
		s.fail(x, serverError(err.Error()), outcomeUpstream)
		return false
	}
	outHeaders(req.Header, x.r.Header, x.ID, ep.APIKey())
	req.ContentLength = int64(len(body))
	resp, err := x.m.transport.RoundTrip(req)
	if err != nil {
		if x.r.Context().Err() == nil && !errors.Is(context.Cause(ctx), errFirstByteTimeout) {
			s.deps.Fleet.Report(ep, fleet.OutcomeOfError(err))
			if canRetry {
				return true
			}
		}
		return s.upstreamFailed(ctx, x, ep, err, false)
	}
	defer resp.Body.Close()
	s.deps.Fleet.Report(ep, fleet.OutcomeOf(resp.StatusCode))
	s.relay(ctx, x, ep, wd, resp, nil, func() {})
	return false
}
