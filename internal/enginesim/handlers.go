package enginesim

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"kvrouter/internal/vllm"
)

func (s *Server) routes() {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/completions", s.dispatch(false))
	mux.HandleFunc("POST /v1/chat/completions", s.dispatch(true))
	mux.HandleFunc("POST /v1/responses", s.serveResponses) // responses.go
	mux.HandleFunc("GET /v1/models", s.models)
	if s.cfg.AllowRuntimeLoRA {
		mux.HandleFunc("POST /v1/load_lora_adapter", s.loadLoRA)
	}
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("POST /tokenize", s.tokenize)
	mux.HandleFunc("POST /v1/chat/completions/render", s.render(true))
	mux.HandleFunc("POST /v1/completions/render", s.render(false))
	mux.HandleFunc("POST /reset_prefix_cache", func(w http.ResponseWriter, r *http.Request) {
		if err := s.ResetPrefixCache(r.Context()); err != nil {
			writeError(w, http.StatusConflict, err.Error())
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	mux.HandleFunc("POST /admin/restart", func(w http.ResponseWriter, r *http.Request) {
		if err := s.Restart(r.Context()); err != nil {
			writeError(w, http.StatusInternalServerError, err.Error())
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	mux.HandleFunc("POST /admin/freeze", func(w http.ResponseWriter, r *http.Request) {
		d, err := time.ParseDuration(r.URL.Query().Get("duration"))
		if err != nil || d < 0 {
			writeError(w, http.StatusBadRequest, "duration must be a Go duration, e.g. ?duration=5s (0s thaws)")
			return
		}
		if err := s.Freeze(r.Context(), d); err != nil {
			writeError(w, http.StatusInternalServerError, err.Error())
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	mux.HandleFunc("POST /admin/stall-events", func(w http.ResponseWriter, r *http.Request) {
		d, err := time.ParseDuration(r.URL.Query().Get("duration"))
		if err != nil || d <= 0 {
			writeError(w, http.StatusBadRequest, "duration must be a positive Go duration, e.g. ?duration=5s")
			return
		}
		if err := s.StallEvents(r.Context(), d); err != nil {
			writeError(w, http.StatusConflict, err.Error())
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.gatherer(), promhttp.HandlerOpts{}))
	s.mux = mux
}

// gatherer is the registry the metrics were registered on, when it can
// gather; otherwise an empty one.
func (s *Server) gatherer() prometheus.Gatherer {
	if g, ok := s.reg.(prometheus.Gatherer); ok {
		return g
	}
	return prometheus.NewRegistry()
}

// writeError writes vLLM's error body: {"error": {"message", "type",
// "param", "code"}}, type named after the status ("BadRequestError").
func writeError(w http.ResponseWriter, status int, msg string) {
	typ := strings.ReplaceAll(http.StatusText(status), " ", "")
	if !strings.HasSuffix(typ, "Error") {
		typ += "Error"
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(apiError{Error: apiErrorInfo{Message: msg, Type: typ, Code: status}})
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	if err != nil {
		writeError(w, http.StatusBadRequest, "reading body: "+err.Error())
		return nil, false
	}
	return body, true
}

func (s *Server) models(w http.ResponseWriter, _ *http.Request) {
	type model struct {
		ID          string  `json:"id"`
		Object      string  `json:"object"`
		Created     int64   `json:"created"`
		OwnedBy     string  `json:"owned_by"`
		Root        string  `json:"root"`
		Parent      *string `json:"parent"`
		MaxModelLen *int    `json:"max_model_len"`
		Permission  []any   `json:"permission"`
	}
	// As vLLM's OpenAIServingModels.show_available_models: the base
	// model's card carries max_model_len, an adapter's card has it null.
	base := s.cfg.ServedModelName
	maxLen := s.coreCfg.MaxModelLen
	data := []model{{ID: base, Object: "model", Created: s.created, OwnedBy: "vllm", Root: base,
		MaxModelLen: &maxLen, Permission: []any{}}}
	for _, l := range s.loras.list() {
		data = append(data, model{ID: l, Object: "model", Created: s.created, OwnedBy: "vllm", Root: l,
			Parent: &base, Permission: []any{}})
	}
	writeJSON(w, map[string]any{"object": "list", "data": data})
}

func (s *Server) tokenize(w http.ResponseWriter, r *http.Request) {
	body, ok := s.readBody(w, r)
	if !ok {
		return
	}
	var req tokenizeRequest
	if err := json.Unmarshal(body, &req); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	var toks []uint32
	var err error
	switch {
	case req.Prompt != nil:
		toks, err = s.tok.Encode(*req.Prompt, req.AddSpecialTokens == nil || *req.AddSpecialTokens)
	case len(req.Messages) > 0:
		toks, _, err = s.encodeChat(body)
	default:
		err = errors.New("either prompt or messages is required")
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	writeJSON(w, tokenizeResponse{Count: len(toks), MaxModelLen: s.coreCfg.MaxModelLen, Tokens: nonNil(toks)})
}

func nonNil(t []uint32) []uint32 {
	if t == nil {
		return []uint32{}
	}
	return t
}

// prompts turns a request into token-id prompts, or writes the error; mm
// are a chat's image items (media.go).
func (s *Server) prompts(w http.ResponseWriter, req *genRequest, body []byte, chat bool) (out [][]uint32, mm []vllm.MMFeature, ok bool) {
	if chat {
		if len(req.Messages) == 0 {
			writeError(w, http.StatusBadRequest, "messages is required")
			return nil, nil, false
		}
		toks, items, err := s.encodeChat(body)
		if err != nil {
			writeError(w, http.StatusBadRequest, err.Error())
			return nil, nil, false
		}
		out, mm = append(out, toks), items
	} else {
		ps, err := parsePrompts(req.Prompt)
		if err != nil {
			writeError(w, http.StatusBadRequest, err.Error())
			return nil, nil, false
		}
		addSpecial := req.AddSpecialTokens == nil || *req.AddSpecialTokens
		for _, p := range ps {
			if p.isIDs {
				out = append(out, p.ids)
				continue
			}
			toks, err := s.tok.Encode(p.text, addSpecial)
			if err != nil {
				writeError(w, http.StatusBadRequest, err.Error())
				return nil, nil, false
			}
			out = append(out, toks)
		}
	}
	for _, p := range out {
		if msg := s.checkPrompt(p); msg != "" {
			writeError(w, http.StatusBadRequest, msg)
			return nil, nil, false
		}
	}
	return out, mm, true
}

// checkPrompt applies vLLM's prompt checks; "" when fine.
func (s *Server) checkPrompt(p []uint32) string {
	if len(p) == 0 {
		return "The decoder prompt cannot be empty"
	}
	if n, maxLen := len(p), s.coreCfg.MaxModelLen; n > maxLen {
		return fmt.Sprintf("This model's maximum context length is %d tokens. However, your request has %d input tokens. Please reduce the length of the input messages.", maxLen, n)
	}
	for _, t := range p {
		if int(t) >= s.coreCfg.VocabSize {
			return fmt.Sprintf("Token id %d is out of vocabulary", t)
		}
	}
	return ""
}

// maxTokens resolves max_tokens for a prompt, or returns vLLM's message.
func (s *Server) maxTokens(req *genRequest, chat bool, promptLen int) (int, string) {
	limit := s.coreCfg.MaxModelLen - promptLen
	v := req.MaxTokens
	if chat && req.MaxCompletionTokens != nil {
		v = req.MaxCompletionTokens
	}
	switch {
	case v != nil && *v > limit:
		return 0, fmt.Sprintf("'max_tokens' or 'max_completion_tokens' is too large: %d. This model's maximum context length is %d tokens and your request has %d input tokens (%d > %d - %d).",
			*v, s.coreCfg.MaxModelLen, promptLen, *v, s.coreCfg.MaxModelLen, promptLen)
	case v != nil:
		return *v, ""
	case limit < 1:
		return 0, fmt.Sprintf("This model's maximum context length is %d tokens. However, your request has %d input tokens, leaving no room for output.", s.coreCfg.MaxModelLen, promptLen)
	case chat:
		return min(s.cfg.DefaultMaxTokens, limit), ""
	}
	return min(16, limit), "" // CompletionRequest.max_tokens defaults to 16
}

// loraFor maps the model field to the LoRA name ("" for the base model);
// ok is false for an unknown model.
func (s *Server) loraFor(model string) (string, bool) {
	if model == "" || model == s.cfg.ServedModelName {
		return "", true
	}
	if s.loras.has(model) {
		return model, true
	}
	return "", false
}

// sleepCtx waits d or until the request or the server ends; false if cut.
func (s *Server) sleepCtx(r *http.Request, d time.Duration) bool {
	select {
	case <-s.cfg.Clock.After(d):
		return true
	case <-r.Context().Done():
		return false
	}
}
