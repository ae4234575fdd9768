package request

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// The Responses API (POST /v1/responses), as vLLM serves it:
//
//   - Input (vllm/entrypoints/openai/responses/protocol.py ResponsesRequest):
//     "input" is a string or a list of items; "instructions" a string;
//     "previous_response_id" names a stored response to continue;
//     "request_id" (default "resp_" + a random uuid) becomes the response's
//     id (ResponsesResponse.from_request: id=request.request_id).
//   - Rendering (responses/serving.py _make_request, responses/utils.py
//     construct_input_messages): the instructions become a system message
//     first (when not empty); a string input one user message; message
//     items go to the chat template as chat messages (a user, system or
//     developer item as it is, its input_text parts read as text; an
//     assistant item as its first part's text); the chat template renders
//     them with add_generation_prompt unless the last item is an unfinished
//     assistant message, and with reasoning.effort as the template's
//     reasoning_effort (ResponsesRequest.build_chat_params). gpt-oss models
//     render through Harmony instead (_make_request_with_harmony).
//   - State (responses/serving.py response_store and msg_store): plain
//     dicts in the API server process's memory, filled only when the
//     engine runs with VLLM_ENABLE_RESPONSES_API_STORE=1 (otherwise store
//     is silently false). A previous_response_id the process does not hold
//     is answered 404 {"error": {"message": "Response with id '<id>' not
//     found.", "type": "invalid_request_error", "param": "response_id",
//     "code": 404}} (_make_not_found_error). A restart loses every stored
//     response.
//   - Streaming (responses/api_router.py _convert_stream_to_sse_events):
//     named events ("event: <type>" then "data: <json>"), the last one
//     response.completed; no "data: [DONE]".
//
// So the router tokenizes an input it can render exactly (a string, or
// message items with text parts only; no tools, no previous state) as a
// chat and routes it with the kv policy like a chat request. An input it
// cannot render (function calls, reasoning items, images, tools, an
// unfinished assistant message) is routed by load. A request with
// previous_response_id is pinned to the engine holding that response
// (package proxy).

// responsesWire is the part of a Responses body the router reads, raw so
// that wrong types are reported as 400s naming the field.
type responsesWire struct {
	Input        json.RawMessage `json:"input"`
	Instructions json.RawMessage `json:"instructions"`
	PrevID       json.RawMessage `json:"previous_response_id"`
	RequestID    json.RawMessage `json:"request_id"`
	MaxOutput    json.RawMessage `json:"max_output_tokens"`
	Tools        json.RawMessage `json:"tools"`
	Reasoning    json.RawMessage `json:"reasoning"`
	PrevInput    json.RawMessage `json:"previous_input_messages"`
	PrevResponse json.RawMessage `json:"previous_response"`
}

// ResponsesFields are a Responses request's own fields (Parsed.Responses).
type ResponsesFields struct {
	// PrevID is previous_response_id, "" when absent.
	PrevID string
	// RequestID is the client's request_id (the response's id to be), ""
	// when absent: the router then chooses it.
	RequestID string
	// ChatBody is the input as a chat request body the tokenizer renders
	// ({"messages", "add_generation_prompt", "chat_template_kwargs"}); nil
	// when the input cannot be rendered exactly (route by load).
	ChatBody []byte
}

// parseResponses reads and checks a Responses body's own fields.
func (r *Parsed) parseResponses() *Error {
	var w responsesWire
	if err := json.Unmarshal(r.Body, &w); err != nil {
		return Invalid("", fmt.Sprintf("malformed JSON: %v", err))
	}
	r.Responses = &ResponsesFields{}
	for _, f := range []struct {
		name string
		raw  json.RawMessage
		dst  *string
	}{{"previous_response_id", w.PrevID, &r.Responses.PrevID}, {"request_id", w.RequestID, &r.Responses.RequestID}} {
		if isNull(f.raw) {
			continue
		}
		if json.Unmarshal(f.raw, f.dst) != nil || *f.dst == "" {
			return Invalid(f.name, f.name+" must be a non-empty string")
		}
	}
	if !isNull(w.MaxOutput) {
		var n int
		if err := json.Unmarshal(w.MaxOutput, &n); err != nil || n < 0 {
			return Invalid("max_output_tokens", "max_output_tokens must be a non-negative integer")
		}
		// vLLM checks the context length with it (build_tok_params).
		r.MaxTokens, r.OutputTokens = n, n
	}
	var instructions string
	if !isNull(w.Instructions) && json.Unmarshal(w.Instructions, &instructions) != nil {
		return Invalid("instructions", "instructions must be a string")
	}
	if isNull(w.Input) {
		return Invalid("input", "input is required")
	}
	var msgs []json.RawMessage
	exact := true
	switch bytes.TrimSpace(w.Input)[0] {
	case '"':
		var s string
		_ = json.Unmarshal(w.Input, &s) // valid JSON string: the body decoded
		msgs = append(msgs, chatMessage("user", s))
	case '[':
		var items []json.RawMessage
		if json.Unmarshal(w.Input, &items) != nil {
			return Invalid("input", "input must be a string or an array of input items")
		}
		if len(items) == 0 {
			return Invalid("input", "input must not be empty")
		}
		for i, it := range items {
			if bytes.TrimSpace(it)[0] != '{' {
				return Invalid(fmt.Sprintf("input[%d]", i), fmt.Sprintf("input[%d] must be an object", i))
			}
			m, ok := itemMessage(it, i == len(items)-1)
			if !ok {
				exact = false
				continue
			}
			msgs = append(msgs, m)
		}
	default:
		return Invalid("input", "input must be a string or an array of input items")
	}
	if instructions != "" {
		msgs = append([]json.RawMessage{chatMessage("system", instructions)}, msgs...)
	}
	r.messages = msgs
	if r.Responses.PrevID != "" || !isNull(w.PrevInput) || !isNull(w.PrevResponse) || hasItems(w.Tools) {
		// The prompt holds state the router does not have (a stored
		// conversation, Harmony messages) or tool definitions the
		// template renders in vLLM's own conversion: route by load.
		exact = false
	}
	if !exact {
		return nil
	}
	kwargs := json.RawMessage(nil)
	var reasoning struct {
		Effort *string `json:"effort"`
	}
	if !isNull(w.Reasoning) && json.Unmarshal(w.Reasoning, &reasoning) == nil && reasoning.Effort != nil {
		kwargs, _ = json.Marshal(map[string]string{"reasoning_effort": *reasoning.Effort})
	}
	all, _ := json.Marshal(msgs) // raw messages: cannot fail
	r.Responses.ChatBody, _ = json.Marshal(struct {
		Messages            json.RawMessage `json:"messages"`
		AddGenerationPrompt bool            `json:"add_generation_prompt"`
		ChatTemplateKwargs  json.RawMessage `json:"chat_template_kwargs,omitempty"`
	}{all, true, kwargs})
	return nil
}

// chatMessage is {"role": role, "content": content}.
func chatMessage(role, content string) json.RawMessage {
	b, _ := json.Marshal(map[string]string{"role": role, "content": content})
	return b
}

// hasItems reports whether raw is a non-empty JSON array.
func hasItems(raw json.RawMessage) bool {
	var a []json.RawMessage
	return !isNull(raw) && json.Unmarshal(raw, &a) == nil && len(a) > 0
}

// itemMessage converts one input item to the chat message vLLM renders for
// it (construct_input_messages), ok false when the router cannot render it
// exactly: anything but a message item of role user, system, developer or
// assistant whose content is a string or text parts, or a last assistant
// message left unfinished (status in_progress or incomplete: vLLM
// continues it, should_continue_final_message).
func itemMessage(raw json.RawMessage, last bool) (json.RawMessage, bool) {
	var it struct {
		Type    *string         `json:"type"`
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
		Status  string          `json:"status"`
	}
	if json.Unmarshal(raw, &it) != nil || it.Type != nil && *it.Type != "message" || isNull(it.Content) {
		return nil, false
	}
	var parts []struct {
		Type string  `json:"type"`
		Text *string `json:"text"`
	}
	text, isString := "", false
	switch bytes.TrimSpace(it.Content)[0] {
	case '"':
		isString = json.Unmarshal(it.Content, &text) == nil
	case '[':
		if json.Unmarshal(it.Content, &parts) != nil || len(parts) == 0 {
			return nil, false
		}
		for _, p := range parts {
			if p.Text == nil || p.Type != "input_text" && p.Type != "output_text" && p.Type != "text" {
				return nil, false
			}
		}
	default:
		return nil, false
	}
	switch it.Role {
	case "user", "system", "developer":
		if isString {
			return chatMessage(it.Role, text), true
		}
		// vLLM renders the parts as they are (input_text reads as text).
		b, _ := json.Marshal(map[string]any{"role": it.Role, "content": it.Content})
		return b, true
	case "assistant":
		if last && (it.Status == "in_progress" || it.Status == "incomplete") {
			return nil, false
		}
		if !isString {
			text = *parts[0].Text // vLLM keeps the first part's text
		}
		return chatMessage("assistant", text), true
	}
	return nil, false
}
