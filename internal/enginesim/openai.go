package enginesim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// errBadRequest marks request bodies vLLM answers with 400.
var errBadRequest = errors.New("bad request")

// streamOptions is OpenAI's stream_options.
type streamOptions struct {
	IncludeUsage         bool `json:"include_usage"`
	ContinuousUsageStats bool `json:"continuous_usage_stats"`
}

// genRequest holds the fields of /v1/completions and /v1/chat/completions
// bodies the simulator uses; other fields are accepted and ignored, as
// vLLM's request models allow extra fields.
type genRequest struct {
	Model               string          `json:"model"`
	Prompt              json.RawMessage `json:"prompt"`
	Messages            json.RawMessage `json:"messages"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	N                   *int            `json:"n"`
	Stream              bool            `json:"stream"`
	StreamOptions       *streamOptions  `json:"stream_options"`
	CacheSalt           *string         `json:"cache_salt"`
	VLLMXArgs           map[string]any  `json:"vllm_xargs"`
	AddSpecialTokens    *bool           `json:"add_special_tokens"`
	// KVTransferParams is vLLM's kv_transfer_params (pdserver.go).
	KVTransferParams map[string]any `json:"kv_transfer_params"`
}

// maxChoices bounds n and the number of prompts per request.
const maxChoices = 128

// decodeGenRequest parses a request body. Errors wrap errBadRequest.
func decodeGenRequest(body []byte) (*genRequest, error) {
	var r genRequest
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if err := dec.Decode(&r); err != nil {
		return nil, fmt.Errorf("%w: %v", errBadRequest, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: trailing data after the JSON object", errBadRequest)
	}
	if r.N != nil && (*r.N < 1 || *r.N > maxChoices) {
		return nil, fmt.Errorf("%w: n must be between 1 and %d, got %d", errBadRequest, maxChoices, *r.N)
	}
	for _, v := range []*int{r.MaxTokens, r.MaxCompletionTokens} {
		if v != nil && *v < 1 {
			return nil, fmt.Errorf("%w: max_tokens must be at least 1, got %d", errBadRequest, *v)
		}
	}
	if r.CacheSalt != nil && *r.CacheSalt == "" {
		// vLLM: "Parameter 'cache_salt' must be a non-empty string if provided."
		return nil, fmt.Errorf("%w: parameter 'cache_salt' must be a non-empty string if provided", errBadRequest)
	}
	if m, ok := r.VLLMXArgs["kv_cache_report_mode"]; ok {
		if s, ok := m.(string); !ok || (s != "full" && s != "none" && s != "") {
			return nil, fmt.Errorf("%w: vllm_xargs.kv_cache_report_mode must be \"full\" or \"none\"", errBadRequest)
		}
	}
	return &r, nil
}

// reportHits is vllm_xargs.kv_cache_report_mode == "full".
func (r *genRequest) reportHits() bool {
	s, _ := r.VLLMXArgs["kv_cache_report_mode"].(string)
	return s == "full"
}

// choices is n, default 1.
func (r *genRequest) choices() int {
	if r.N == nil {
		return 1
	}
	return *r.N
}

// promptInput is one prompt of a completion request: text, or token ids
// when isIDs.
type promptInput struct {
	text  string
	ids   []uint32
	isIDs bool
}

// parsePrompts decodes the prompt field: a string, a list of token ids, or a
// list of either, in order. Errors wrap errBadRequest.
func parsePrompts(raw json.RawMessage) ([]promptInput, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, fmt.Errorf("%w: prompt is required", errBadRequest)
	}
	var s string
	if raw[0] == '"' {
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, fmt.Errorf("%w: prompt: %v", errBadRequest, err)
		}
		return []promptInput{{text: s}}, nil
	}
	var ids []uint32
	if err := json.Unmarshal(raw, &ids); err == nil {
		if len(ids) == 0 {
			return nil, fmt.Errorf("%w: prompt cannot be empty", errBadRequest)
		}
		return []promptInput{{ids: ids, isIDs: true}}, nil
	}
	var list []json.RawMessage
	if err := json.Unmarshal(raw, &list); err != nil || len(list) == 0 {
		return nil, fmt.Errorf("%w: prompt must be a string, a list of token ids, or a list of either", errBadRequest)
	}
	if len(list) > maxChoices {
		return nil, fmt.Errorf("%w: at most %d prompts per request", errBadRequest, maxChoices)
	}
	out := make([]promptInput, 0, len(list))
	for i, item := range list {
		item = bytes.TrimSpace(item)
		switch {
		case len(item) > 0 && item[0] == '"':
			if err := json.Unmarshal(item, &s); err != nil {
				return nil, fmt.Errorf("%w: prompt[%d]: %v", errBadRequest, i, err)
			}
			out = append(out, promptInput{text: s})
		case len(item) > 0 && item[0] == '[':
			var sub []uint32
			if err := json.Unmarshal(item, &sub); err != nil {
				return nil, fmt.Errorf("%w: prompt[%d] must be a list of token ids below 2^32", errBadRequest, i)
			}
			out = append(out, promptInput{ids: sub, isIDs: true})
		default:
			return nil, fmt.Errorf("%w: prompt[%d] must be a string or a list of token ids", errBadRequest, i)
		}
	}
	return out, nil
}

// usage is OpenAI's usage object with vLLM's prompt_tokens_details.
type usage struct {
	PromptTokens        int            `json:"prompt_tokens"`
	TotalTokens         int            `json:"total_tokens"`
	CompletionTokens    int            `json:"completion_tokens"`
	PromptTokensDetails *promptDetails `json:"prompt_tokens_details,omitempty"`
}

type promptDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

// apiError is the body of an error response: {"error": {...}}, vLLM's
// ErrorResponse (vllm/entrypoints/openai/protocol.py).
type apiError struct {
	Error apiErrorInfo `json:"error"`
}

type apiErrorInfo struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    int     `json:"code"`
}

// completionChoice is a /v1/completions choice (streaming and not).
type completionChoice struct {
	Index        int     `json:"index"`
	Text         string  `json:"text"`
	Logprobs     any     `json:"logprobs"`
	FinishReason *string `json:"finish_reason"`
	StopReason   any     `json:"stop_reason"`
}

type completionResponse struct {
	ID      string             `json:"id"`
	Object  string             `json:"object"`
	Created int64              `json:"created"`
	Model   string             `json:"model"`
	Choices []completionChoice `json:"choices"`
	Usage   *usage             `json:"usage"`
	// KVTransferParams answers a prefill leg (vLLM CompletionResponse).
	KVTransferParams map[string]any `json:"kv_transfer_params,omitempty"`
}

type chatMessage struct {
	Role    string `json:"role,omitempty"`
	Content string `json:"content"`
}

type chatChoice struct {
	Index        int          `json:"index"`
	Message      *chatMessage `json:"message,omitempty"`
	Delta        *chatMessage `json:"delta,omitempty"`
	Logprobs     any          `json:"logprobs"`
	FinishReason *string      `json:"finish_reason"`
	StopReason   any          `json:"stop_reason,omitempty"`
}

type chatResponse struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"`
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []chatChoice `json:"choices"`
	Usage   *usage       `json:"usage,omitempty"`
	// KVTransferParams answers a prefill leg (vLLM ChatCompletionResponse).
	KVTransferParams map[string]any `json:"kv_transfer_params,omitempty"`
}

// tokenizeRequest is POST /tokenize: a prompt or a chat.
type tokenizeRequest struct {
	Prompt           *string         `json:"prompt"`
	Messages         json.RawMessage `json:"messages"`
	AddSpecialTokens *bool           `json:"add_special_tokens"`
}

type tokenizeResponse struct {
	Count       int      `json:"count"`
	MaxModelLen int      `json:"max_model_len"`
	Tokens      []uint32 `json:"tokens"`
	TokenStrs   []string `json:"token_strs"`
}
