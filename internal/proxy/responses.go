package proxy

import (
	"bytes"
	"fmt"
	"net/http"

	"kvrouter/internal/request"
)

// responsesPath is the Responses endpoint's path on the router and on the
// engine (request.Responses.Path()).
const responsesPath = "/v1/responses"

// serveResponses handles POST /v1/responses: routed like a chat request
// when its input renders exactly, pinned to its holder when it continues
// a stored response (responsepin.go).
func (s *Server) serveResponses(w http.ResponseWriter, r *http.Request) {
	x := s.newExchange(w, r)
	s.startSpan(x, r.URL.Path)
	defer s.finish(x)
	if !s.prepare(x.Ctx, x, request.Responses) {
		return
	}
	if x.m.pd != nil {
		// vLLM's ResponsesRequest has no kv_transfer_params: no P/D legs.
		s.fail(x, badRequest("model", fmt.Sprintf("model %q is served disaggregated (prefill/decode); /v1/responses is not supported for it", x.m.Cfg.Name)), outcomeBadRequest)
		return
	}
	if v := r.Header.Get("X-Kvrouter-Route-Only"); v != "" && v != "0" && v != "false" {
		s.explain(x.Ctx, x)
		return
	}
	s.forward(x.Ctx, x) // pinned by its features (responsepin.go)
}

// responseEnds are the event lines of a Responses stream's last event:
// vLLM ends a stream with response.completed (whatever the response's
// status); OpenAI's API also names response.incomplete and
// response.failed as final.
var responseEnds = [][]byte{[]byte("event: response.completed"), []byte("event: response.incomplete"), []byte("event: response.failed")}

// openingEvents are the events a Responses stream starts with, sent by
// vLLM's API server before the engine's first output
// (serving_responses.py responses_stream_generator).
var openingEvents = [][]byte{[]byte("response.created"), []byte("response.in_progress")}

// onlyOpening reports whether b, whole events, has event lines and all of
// them name opening events. Data without an event line counts as output.
func onlyOpening(b []byte) bool {
	seen := false
	for line := range bytes.Lines(b) {
		typ, ok := bytes.CutPrefix(line, []byte("event:"))
		if !ok {
			continue
		}
		typ = bytes.TrimSpace(typ)
		opening := false
		for _, e := range openingEvents {
			opening = opening || bytes.Equal(typ, e)
		}
		if !opening {
			return false
		}
		seen = true
	}
	return seen
}

// endsResponse reports whether b, whole events, holds a Responses
// stream's final event (a line starting with one of responseEnds).
func endsResponse(b []byte) bool {
	for _, e := range responseEnds {
		for i := 0; ; {
			j := bytes.Index(b[i:], e)
			if j < 0 {
				break
			}
			at := i + j
			if at == 0 || b[at-1] == '\n' {
				return true
			}
			i = at + len(e)
		}
	}
	return false
}
