package proxy

import (
	"fmt"
	"net/http"
)

// maxModelLen is the context length, in tokens, of model's engines as
// the fleet last read it from their GET /v1/models cards (vLLM's ModelCard
// max_model_len; fleet.Endpoint.MaxModelLen): the largest of them, so the
// router never refuses what some engine accepts; 0 while none is known.
func (s *Server) maxModelLen(model string) int {
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
func (s *Server) tooLong(x *exchange) *apiError {
	if x.m.cfg.TooLong != TooLongReject || x.tokens == nil {
		return nil
	}
	limit := s.maxModelLen(x.m.cfg.Name)
	prompt, out := len(x.tokens), x.req.OutputTokens
	if limit <= 0 || prompt+out <= limit {
		return nil
	}
	return &apiError{status: http.StatusBadRequest, typ: typeVLLMBadRequest, param: "input_tokens",
		message: fmt.Sprintf("This model's maximum context length is %d tokens. However, you requested %d output tokens and your prompt contains %d input tokens, for a total of %d tokens. Please reduce the length of the input prompt or the number of requested output tokens. (parameter=input_tokens, value=%d)",
			limit, out, prompt, prompt+out, prompt)}
}
