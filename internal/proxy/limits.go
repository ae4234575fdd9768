package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"
)

// The engines' context length (vLLM's max_model_len) is read from their GET
// /v1/models cards ({"id", "max_model_len", ...}; vLLM's ModelCard), at
// start and then every limitsInterval (every second while a model's is
// unknown), and from every listing a client asks for.
const (
	limitsInterval = 30 * time.Second
	limitsRetry    = time.Second
)

// refreshLimits lists the up engines' models once and records each
// configured model's max_model_len; it reports whether every model's is
// known.
func (s *Server) refreshLimits(ctx context.Context) bool {
	cards, _ := s.deps.Fleet.ListModels(ctx)
	s.learnLimits(cards)
	for _, m := range s.models {
		if m.maxModelLen.Load() == 0 {
			return false
		}
	}
	return true
}

// learnLimits records the max_model_len of the cards of configured models
// (ListModels: the first up engine's card of each model id). A change is
// logged.
func (s *Server) learnLimits(cards []json.RawMessage) {
	for _, c := range cards {
		var card struct {
			ID          string `json:"id"`
			MaxModelLen int64  `json:"max_model_len"`
		}
		if json.Unmarshal(c, &card) != nil || card.MaxModelLen <= 0 {
			continue
		}
		m, ok := s.models[card.ID]
		if !ok {
			continue
		}
		if old := m.maxModelLen.Swap(card.MaxModelLen); old != card.MaxModelLen {
			s.log.Info("engines' context length learned", "model", card.ID, "max_model_len", card.MaxModelLen, "was", old)
		}
	}
}

// runLimits refreshes the context lengths until ctx ends.
func (s *Server) runLimits(ctx context.Context) {
	for {
		d := limitsInterval
		if !s.refreshLimits(ctx) {
			d = limitsRetry
		}
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
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
	limit := int(x.m.maxModelLen.Load())
	prompt, out := len(x.tokens), x.req.outputTokens
	if limit <= 0 || prompt+out <= limit {
		return nil
	}
	return &apiError{status: http.StatusBadRequest, typ: typeVLLMBadRequest, param: "input_tokens",
		message: fmt.Sprintf("This model's maximum context length is %d tokens. However, you requested %d output tokens and your prompt contains %d input tokens, for a total of %d tokens. Please reduce the length of the input prompt or the number of requested output tokens. (parameter=input_tokens, value=%d)",
			limit, out, prompt, prompt+out, prompt)}
}
