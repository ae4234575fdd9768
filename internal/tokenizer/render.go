package tokenizer

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// RemoteConfig configures a Remote. A zero field means the default in its
// comment (DefaultRemoteConfig fills them in).
type RemoteConfig struct {
	// URL is the engine's base URL, e.g. "http://10.0.0.7:8000". Required.
	URL string `yaml:"url"`
	// Model is sent as the request's "model"; empty omits it (vLLM then
	// uses its served model).
	Model string `yaml:"model"`
	// Timeout bounds each call to the engine. Default 5s.
	Timeout time.Duration `yaml:"timeout"`
	// RenderRetry is how long to go straight to /tokenize after the render
	// endpoints answered "no such route", before trying them again.
	// Default 10m.
	RenderRetry time.Duration `yaml:"render_retry"`
	// MaxResponseBytes caps a response body. Default 64 MiB.
	MaxResponseBytes int64 `yaml:"max_response_bytes"`
	// Client sends the requests (e.g. one whose transport trusts the CA of
	// https:// engines); nil: a client with Go's default transport.
	Client *http.Client `yaml:"-"`
}

// DefaultRemoteConfig returns cfg with its zero fields set to defaults.
func DefaultRemoteConfig(cfg RemoteConfig) RemoteConfig {
	if cfg.Timeout == 0 {
		cfg.Timeout = 5 * time.Second
	}
	if cfg.RenderRetry == 0 {
		cfg.RenderRetry = 10 * time.Minute
	}
	if cfg.MaxResponseBytes == 0 {
		cfg.MaxResponseBytes = 64 << 20
	}
	return cfg
}

// EngineError is a non-2xx answer from the engine (vLLM's ErrorResponse
// message when the body has one). A 400 means vLLM rejected the request
// itself; callers may pass it on to the client.
type EngineError struct {
	Endpoint string // request path, e.g. "/tokenize"
	Status   int    // HTTP status code
	Message  string // the engine's error message, or the start of the body
}

// Error names the endpoint, the HTTP status and the engine's message.
func (e *EngineError) Error() string {
	return fmt.Sprintf("engine %s: HTTP %d: %s", e.Endpoint, e.Status, e.Message)
}

// Remote asks a vLLM engine for the exact token ids of a prompt: through
// POST /v1/chat/completions/render and /v1/completions/render (vLLM's
// serve/render/api_router.py, which answer with GenerateRequest objects
// carrying "token_ids"), or through POST /tokenize on engines without them
// ({"count", "max_model_len", "tokens"}). It is safe for concurrent use and
// starts no goroutines.
type Remote struct {
	cfg    RemoteConfig
	client *http.Client
	log    *slog.Logger
	m      *metrics
	now    func() time.Time
	// noRenderUntil is the unix-nano time until which the render endpoints
	// are known to be missing; 0 when they are believed present.
	noRenderUntil atomic.Int64
	// renderMissing is the state logged: set by the first "no such route"
	// answer, cleared by the next render answer, so that a burst of
	// requests (each seeing the route missing at once), or a retry after
	// RenderRetry that finds it still missing, logs nothing more.
	renderMissing atomic.Bool
}

// NewRemote returns a Remote for the engine at cfg.URL. A nil log discards.
func NewRemote(cfg RemoteConfig, log *slog.Logger, reg prometheus.Registerer) (*Remote, error) {
	cfg = DefaultRemoteConfig(cfg)
	var errs []error
	if cfg.URL == "" {
		errs = append(errs, errors.New("remote tokenizer: url is required"))
	} else if !strings.HasPrefix(cfg.URL, "http://") && !strings.HasPrefix(cfg.URL, "https://") {
		errs = append(errs, fmt.Errorf("remote tokenizer: url %q: want http:// or https://", cfg.URL))
	}
	if cfg.Timeout < 0 || cfg.RenderRetry < 0 || cfg.MaxResponseBytes < 0 {
		errs = append(errs, errors.New("remote tokenizer: negative timeout, render_retry or max_response_bytes"))
	}
	m, err := newMetrics(reg)
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cfg.URL = strings.TrimRight(cfg.URL, "/")
	client := cfg.Client
	if client == nil {
		client = &http.Client{}
	}
	return &Remote{
		cfg:    cfg,
		client: client,
		log:    log.With("engine", cfg.URL),
		m:      m,
		now:    time.Now,
	}, nil
}

// Engine endpoints and their metric labels.
const (
	pathChatRender       = "/v1/chat/completions/render"
	pathCompletionRender = "/v1/completions/render"
	pathTokenize         = "/tokenize"
)

var endpointLabel = map[string]string{
	pathChatRender:       "chat_render",
	pathCompletionRender: "completion_render",
	pathTokenize:         "tokenize",
}

// errNoRoute marks an engine without the render endpoints.
var errNoRoute = errors.New("render endpoint not served")

// Chat returns the ids the engine computes for a chat request: from
// /v1/chat/completions/render, or /tokenize when the engine lacks it.
func (r *Remote) Chat(ctx context.Context, req ChatRequest) ([]uint32, error) {
	out, err := r.ChatRendered(ctx, req)
	return out.IDs, err
}

// ChatRendered is Chat with the prompt's multimodal items: the render
// endpoint's "features" (decodeMMFeatures) come back in Rendered.MM; ids
// from the /tokenize fallback come with none. A features field that does
// not fit the ids is an error.
func (r *Remote) ChatRendered(ctx context.Context, req ChatRequest) (Rendered, error) {
	if r.renderAvailable() {
		body := r.chatBody(req, false)
		var out struct {
			TokenIDs []uint32        `json:"token_ids"`
			Features json.RawMessage `json:"features"`
		}
		err := r.post(ctx, pathChatRender, body, &out)
		if err == nil {
			mm, err := decodeMMFeatures(out.Features, len(out.TokenIDs))
			if err != nil {
				return Rendered{}, fmt.Errorf("engine %s: %w", pathChatRender, err)
			}
			return Rendered{IDs: out.TokenIDs, MM: mm}, nil
		}
		if !errors.Is(err, errNoRoute) {
			return Rendered{}, err
		}
	}
	ids, err := r.TokenizeChat(ctx, req)
	return Rendered{IDs: ids}, err
}

// Completion returns the ids the engine computes for a completion prompt:
// from /v1/completions/render, or /tokenize when the engine lacks it.
func (r *Remote) Completion(ctx context.Context, prompt string, addSpecialTokens bool) ([]uint32, error) {
	if r.renderAvailable() {
		body := r.promptBody(prompt, addSpecialTokens)
		var out renderList
		err := r.post(ctx, pathCompletionRender, body, &out)
		if err == nil {
			return out.ids, nil
		}
		if !errors.Is(err, errNoRoute) {
			return nil, err
		}
	}
	return r.Tokenize(ctx, prompt, addSpecialTokens)
}

// Tokenize returns the engine's /tokenize ids for a plain prompt.
func (r *Remote) Tokenize(ctx context.Context, prompt string, addSpecialTokens bool) ([]uint32, error) {
	var out tokenizeResponse
	if err := r.post(ctx, pathTokenize, r.promptBody(prompt, addSpecialTokens), &out); err != nil {
		return nil, err
	}
	return out.Tokens, nil
}

// TokenizeChat returns the engine's /tokenize ids for a chat request,
// rendered with add_special_tokens=false as vLLM does for chats.
func (r *Remote) TokenizeChat(ctx context.Context, req ChatRequest) ([]uint32, error) {
	var out tokenizeResponse
	if err := r.post(ctx, pathTokenize, r.chatBody(req, true), &out); err != nil {
		return nil, err
	}
	return out.Tokens, nil
}

// tokenizeResponse is vLLM's TokenizeResponse.
type tokenizeResponse struct {
	Count       int      `json:"count"`
	MaxModelLen int      `json:"max_model_len"`
	Tokens      []uint32 `json:"tokens"`
}

// renderList reads /v1/completions/render's list of GenerateRequest (one
// per prompt; we send one), tolerating a single object.
type renderList struct{ ids []uint32 }

func (l *renderList) UnmarshalJSON(data []byte) error {
	type item struct {
		TokenIDs []uint32 `json:"token_ids"`
	}
	data = bytes.TrimSpace(data)
	if len(data) > 0 && data[0] == '{' {
		var it item
		err := json.Unmarshal(data, &it)
		l.ids = it.TokenIDs
		return err
	}
	var items []item
	if err := json.Unmarshal(data, &items); err != nil {
		return err
	}
	if len(items) != 1 {
		return fmt.Errorf("want 1 rendered prompt, got %d", len(items))
	}
	l.ids = items[0].TokenIDs
	return nil
}

func (r *Remote) promptBody(prompt string, addSpecialTokens bool) map[string]any {
	body := map[string]any{"prompt": prompt, "add_special_tokens": addSpecialTokens}
	if r.cfg.Model != "" {
		body["model"] = r.cfg.Model
	}
	return body
}

// chatBody builds a chat request body; forTokenize adds
// add_special_tokens=false, the /tokenize field (render has no such knob).
func (r *Remote) chatBody(req ChatRequest, forTokenize bool) map[string]any {
	body := map[string]any{
		"messages":              rawOrNull(req.Messages),
		"add_generation_prompt": req.AddGenerationPrompt,
	}
	if r.cfg.Model != "" {
		body["model"] = r.cfg.Model
	}
	if forTokenize {
		body["add_special_tokens"] = false
	}
	if req.ContinueFinalMessage {
		body["continue_final_message"] = true
	}
	if req.ChatTemplate != "" {
		body["chat_template"] = req.ChatTemplate
	}
	if t := bytes.TrimSpace(req.Tools); len(t) > 0 && string(t) != "null" {
		body["tools"] = json.RawMessage(t)
	}
	if k := bytes.TrimSpace(req.ChatTemplateKwargs); len(k) > 0 && string(k) != "null" {
		body["chat_template_kwargs"] = json.RawMessage(k)
	}
	return body
}

func rawOrNull(m json.RawMessage) json.RawMessage {
	if len(bytes.TrimSpace(m)) == 0 {
		return json.RawMessage("null")
	}
	return m
}

func (r *Remote) renderAvailable() bool {
	until := r.noRenderUntil.Load()
	return until == 0 || r.now().UnixNano() >= until
}

// post sends body to path, decodes a 2xx answer into out, records the call
// in kvrouter_tokenizer_render_seconds, and returns errNoRoute (wrapped)
// when a render path is not served.
func (r *Remote) post(ctx context.Context, path string, body any, out any) (err error) {
	start := r.now()
	outcome := "error"
	defer func() {
		r.m.renderSeconds.WithLabelValues(endpointLabel[path], outcome).Observe(r.now().Sub(start).Seconds())
	}()
	payload, err := json.Marshal(body)
	if err != nil {
		return fmt.Errorf("engine %s: encode request: %w", path, err)
	}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, r.cfg.URL+path, bytes.NewReader(payload))
	if err != nil {
		return fmt.Errorf("engine %s: %w", path, err)
	}
	hreq.Header.Set("Content-Type", "application/json")
	resp, err := r.client.Do(hreq)
	if err != nil {
		switch {
		case errors.Is(err, context.DeadlineExceeded):
			outcome = "timeout"
		case errors.Is(err, context.Canceled):
			outcome = "canceled"
		}
		return fmt.Errorf("engine %s: %w", path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, r.cfg.MaxResponseBytes+1))
	if err != nil {
		if ctx.Err() != nil {
			outcome = "timeout"
		}
		return fmt.Errorf("engine %s: read response: %w", path, err)
	}
	if int64(len(data)) > r.cfg.MaxResponseBytes {
		return fmt.Errorf("engine %s: response larger than %d bytes", path, r.cfg.MaxResponseBytes)
	}
	if resp.StatusCode/100 != 2 {
		msg, isVLLM := errorMessage(data)
		if path != pathTokenize && routeMissing(resp.StatusCode, isVLLM) {
			outcome = "unavailable"
			r.noRenderUntil.Store(r.now().Add(r.cfg.RenderRetry).UnixNano())
			if !r.renderMissing.Swap(true) {
				r.log.Info("engine has no render endpoint; using /tokenize", "path", path, "status", resp.StatusCode, "retry_after", r.cfg.RenderRetry)
			}
			return fmt.Errorf("engine %s: HTTP %d: %w", path, resp.StatusCode, errNoRoute)
		}
		return &EngineError{Endpoint: path, Status: resp.StatusCode, Message: msg}
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("engine %s: decode response: %w", path, err)
	}
	if path != pathTokenize && r.renderMissing.Load() && r.renderMissing.Swap(false) {
		r.log.Info("engine serves its render endpoint again", "path", path)
	}
	outcome = "ok"
	return nil
}

// routeMissing: FastAPI answers an unknown path with 404 {"detail":"Not
// Found"} (or 405 when another method exists), while vLLM's own 404 (model
// not found) is an ErrorResponse; 501 is vLLM's "does not support the
// Render API".
func routeMissing(status int, isVLLMError bool) bool {
	switch status {
	case http.StatusNotImplemented, http.StatusMethodNotAllowed:
		return true
	case http.StatusNotFound:
		return !isVLLMError
	}
	return false
}

// errorMessage extracts the message of vLLM's ErrorResponse, either shape:
// {"error": {"message", "type", "code"}} (current) or {"object": "error",
// "message", ...} (older releases). isVLLM reports whether it was one.
func errorMessage(body []byte) (msg string, isVLLM bool) {
	var e struct {
		Error *struct {
			Message string `json:"message"`
		} `json:"error"`
		Object  string `json:"object"`
		Message string `json:"message"`
	}
	if json.Unmarshal(body, &e) == nil {
		if e.Error != nil {
			return e.Error.Message, true
		}
		if e.Object == "error" {
			return e.Message, true
		}
	}
	s := strings.TrimSpace(string(body))
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return s, false
}
