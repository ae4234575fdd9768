package enginesim

import (
	"encoding/json"
	"fmt"
	"strings"
)

// Tokenizer turns prompts and chats into the token ids the simulated engine
// caches. LoadTokenizer adapts internal/tokenizer (--tokenizer) to it; nil
// in Config means ByteTokenizer. Implementations must be safe for concurrent
// use (handlers call them in parallel).
type Tokenizer interface {
	// Encode tokenizes text; addSpecial adds the model's special tokens
	// (BOS) as /v1/completions does by default.
	Encode(text string, addSpecial bool) ([]uint32, error)
	// EncodeChat renders and tokenizes a chat request body (the JSON of a
	// /v1/chat/completions or /tokenize request: messages, tools,
	// add_generation_prompt, chat_template_kwargs) as vLLM does, without
	// special tokens beyond the template's. Errors are the client's (400).
	EncodeChat(body []byte) ([]uint32, error)
}

// ByteTokenizer is the documented fallback when no tokenizer is given: one
// token per UTF-8 byte of the text (ids 0-255), no special tokens. A chat
// is rendered first as, per message, "<|role|>\n" + content + "\n", then
// "<|assistant|>\n" when add_generation_prompt is true or absent; content
// given as a list of parts contributes the text of its "text" parts joined
// with "\n". Deterministic and safe for concurrent use.
type ByteTokenizer struct{}

// Encode implements Tokenizer.
func (ByteTokenizer) Encode(text string, _ bool) ([]uint32, error) {
	ids := make([]uint32, len(text))
	for i := 0; i < len(text); i++ {
		ids[i] = uint32(text[i])
	}
	return ids, nil
}

// EncodeChat implements Tokenizer.
func (b ByteTokenizer) EncodeChat(body []byte) ([]uint32, error) {
	text, err := renderChatFallback(body)
	if err != nil {
		return nil, err
	}
	return b.Encode(text, false)
}

// renderChatFallback renders a chat body with the fallback template.
func renderChatFallback(body []byte) (string, error) {
	var req struct {
		Messages []struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
		AddGenerationPrompt *bool `json:"add_generation_prompt"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return "", fmt.Errorf("%w: %v", errBadRequest, err)
	}
	if len(req.Messages) == 0 {
		return "", fmt.Errorf("%w: messages must be a non-empty list", errBadRequest)
	}
	var sb strings.Builder
	for i, m := range req.Messages {
		if m.Role == "" {
			return "", fmt.Errorf("%w: messages[%d].role is required", errBadRequest, i)
		}
		content, err := contentText(m.Content)
		if err != nil {
			return "", fmt.Errorf("%w: messages[%d].content: %v", errBadRequest, i, err)
		}
		sb.WriteString("<|" + m.Role + "|>\n" + content + "\n")
	}
	if req.AddGenerationPrompt == nil || *req.AddGenerationPrompt {
		sb.WriteString("<|assistant|>\n")
	}
	return sb.String(), nil
}

// contentText flattens message content: a string, null, or a list of parts.
func contentText(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", fmt.Errorf("must be a string or a list of parts")
	}
	texts := make([]string, 0, len(parts))
	for _, p := range parts {
		if p.Type == "text" {
			texts = append(texts, p.Text)
		}
	}
	return strings.Join(texts, "\n"), nil
}

// outputWords is the vocabulary of the pseudo-text output: token t reads
// as " " + word[t mod 32].
const outputWords = "the cache block token prefix engine router replica " +
	"request batch step prompt model layer key value " +
	"attention memory page hit miss queue decode prefill " +
	"latency stream event hash chain fleet load cost"

// textOf returns the deterministic text of output tokens.
type textOf []string

func newTextOf() textOf { return strings.Fields(outputWords) }

func (w textOf) token(tok uint32) string { return " " + w[tok%uint32(len(w))] }
