package proxy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"kvrouter/internal/fleet"
	"kvrouter/internal/request"
)

// GET /v1/responses/{id} (a stored response; with ?stream=true a
// background response's events) and POST /v1/responses/{id}/cancel (a
// background response) name a response the engine keeps in memory
// (vllm/entrypoints/openai/responses/api_router.py retrieve_responses,
// cancel_responses; serving.py answers vLLM's 404 for an id it does not
// hold). They go where a continuation of that id goes (responsepin.go): the
// engine a router-chosen id names, else the engine learned for a
// client-chosen id first, then every healthy engine of every model in the
// id's order while they answer 404. The query string is kept; the answer
// is relayed as it comes.
//
// The engine's path is built from the parsed parts only: an id of vLLM's
// alphabet (validResponseID) and the query re-encoded, so that no
// client-sent "..", "/" or "?" (percent-encoded or not) reaches the engine
// as path structure.
func (s *Server) serveResponseByID(w http.ResponseWriter, r *http.Request) {
	x := s.newExchange(w, r)
	defer s.finish(x)
	id := r.PathValue("id")
	x.Req = &request.Parsed{Kind: request.Responses, Model: modelUnknown}
	if !validResponseID(id) {
		s.fail(x, &apiError{status: http.StatusBadRequest, typ: typeInvalidRequest, param: "response_id",
			message: fmt.Sprintf("invalid response id %q: want 1 to %d letters, digits, '_' or '-' (vLLM's ids are resp_ and 32 hex digits)", truncate(id, maxEcho), maxResponseID)}, outcomeBadRequest)
		return
	}
	p, err := responseEnginePath(id, strings.HasSuffix(r.Pattern, "/cancel"), r.URL.RawQuery)
	if err != nil {
		s.fail(x, badRequest("", "malformed query string: "+err.Error()), outcomeBadRequest)
		return
	}
	var all []string
	byName := map[string]*fleet.Endpoint{}
	var retry time.Duration
	for _, mc := range s.cfg.Models {
		eps, rt, _ := s.deps.Fleet.Healthy(nil, mc.Name)
		retry = max(retry, rt)
		for _, ep := range eps {
			if byName[ep.Name()] == nil {
				byName[ep.Name()] = ep
				all = append(all, ep.Name())
			}
		}
	}
	hint, tagged := responseEngine(id)
	if !tagged {
		hint, _ = s.learned.get(id)
	}
	order := probeOrder(id, all, hint)
	if tagged && s.deps.Fleet.Endpoint(hint) != nil {
		order = nil
		if byName[hint] != nil {
			order = []string{hint}
		}
	}
	if len(order) == 0 {
		s.fail(x, &apiError{status: http.StatusServiceUnavailable, typ: typeServiceUnavailable, retryAfter: max(retry, time.Second),
			message: fmt.Sprintf("no healthy replica may hold response %q", id)}, outcomeNoReplica)
		return
	}
	for i, name := range order {
		ep := byName[name]
		m := s.models[ep.Models()[0]]
		if m == nil {
			continue
		}
		x.m, x.Group, x.Req.Model, x.Asked, x.replica = m, m.Group, m.Cfg.Name, m.Cfg.Name, name
		if !s.askByID(x.Ctx, x, ep, p, i < len(order)-1) {
			return
		}
		x.retries++
	}
}

// askByID sends the client's request to ep at path (the engine's path and
// query) and relays the answer; true when ep answered 404 and another
// engine may be asked (nothing written).
func (s *Server) askByID(ctx context.Context, x *exchange, ep *fleet.Endpoint, path string, more bool) bool {
	ctx, wd, end := s.startAttempt(ctx, x, ep, 0)
	defer end()
	req, err := http.NewRequestWithContext(ctx, x.r.Method, ep.URL()+path, http.NoBody)
	if err != nil {
		s.fail(x, serverError(err.Error()), outcomeUpstream)
		return false
	}
	outHeaders(req.Header, x.r.Header, x.ID, ep.APIKey())
	resp, err := x.m.transport.RoundTrip(req)
	if err != nil {
		return s.upstreamFailed(ctx, x, ep, err, false)
	}
	defer resp.Body.Close()
	s.deps.Fleet.Report(ep, fleet.OutcomeOf(resp.StatusCode))
	if more && resp.StatusCode == http.StatusNotFound {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
		return true
	}
	s.relay(ctx, x, ep, wd, resp, nil, func() {})
	return false
}

// responseEnginePath returns the engine's path and query for a request
// naming the valid response id: /v1/responses/{id}, then /cancel when
// cancel, then the client's query parsed and encoded again (an error when
// it does not parse).
func responseEnginePath(id string, cancel bool, rawQuery string) (string, error) {
	query, err := url.ParseQuery(rawQuery)
	if err != nil {
		return "", err
	}
	p := responsesPath + "/" + id
	if cancel {
		p += "/cancel"
	}
	if len(query) > 0 {
		p += "?" + query.Encode()
	}
	return p, nil
}

// maxResponseID bounds a response id's length, in bytes.
const maxResponseID = 256

// validResponseID reports whether id may name a response: 1 to
// maxResponseID ASCII letters, digits, '_' and '-'. That holds vLLM's own
// ids ("resp_" + uuid4().hex: ResponsesRequest.request_id's default in
// vllm/entrypoints/openai/responses/protocol.py, random_uuid in
// vllm/utils), the router's (mintResponseID) and uuid-shaped client ids;
// a client-chosen request_id outside it cannot be retrieved through the
// router.
func validResponseID(id string) bool {
	if id == "" || len(id) > maxResponseID {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}
