package enginesim

import (
	"encoding/json"
	"strings"
	"testing"
)

type responsesOutBody struct {
	ID     string `json:"id"`
	Object string `json:"object"`
	Status string `json:"status"`
	Output []struct {
		Content []struct {
			Text string `json:"text"`
		} `json:"content"`
	} `json:"output"`
	Usage struct {
		Input   int `json:"input_tokens"`
		Details struct {
			Cached int `json:"cached_tokens"`
		} `json:"input_tokens_details"`
		Output int `json:"output_tokens"`
	} `json:"usage"`
}

// TestResponses: instructions and a string input render as a system and a
// user message; the id is the body's request_id; a stored response is
// continued by previous_response_id (its conversation and output come
// first, the repeat's prefix is cached); an unknown id is vLLM's 404; a
// stream ends with response.completed; without the store nothing is
// kept.
func TestResponses(t *testing.T) {
	s := startServer(t, Config{ResponsesStore: true, ServedModelName: "m"})
	resp, out := post(t, s.url+"/v1/responses", map[string]any{"model": "m", "instructions": "be brief", "input": "hi",
		"max_output_tokens": 3, "request_id": "resp_abc"})
	var a responsesOutBody
	if resp.StatusCode != 200 || json.Unmarshal(out, &a) != nil {
		t.Fatalf("%d %s", resp.StatusCode, out)
	}
	want, _ := ByteTokenizer{}.EncodeChat([]byte(`{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}]}`))
	if a.ID != "resp_abc" || a.Object != "response" || a.Status != "completed" || a.Usage.Input != len(want) || a.Usage.Output != 3 {
		t.Fatalf("first: %s (want %d input tokens)", out, len(want))
	}
	first := a.Output[0].Content[0].Text

	resp, out = post(t, s.url+"/v1/responses", map[string]any{"model": "m", "previous_response_id": "resp_abc",
		"input": []any{map[string]any{"role": "user", "content": []any{map[string]any{"type": "input_text", "text": "more"}}}}, "max_output_tokens": 2})
	var b responsesOutBody
	if resp.StatusCode != 200 || json.Unmarshal(out, &b) != nil {
		t.Fatalf("continued: %d %s", resp.StatusCode, out)
	}
	// vLLM leaves the stored system message out of the continuation.
	chat, _ := json.Marshal(map[string]any{"messages": []any{map[string]string{"role": "user", "content": "hi"},
		map[string]string{"role": "assistant", "content": first}, map[string]string{"role": "user", "content": "more"}}})
	want, _ = ByteTokenizer{}.EncodeChat(chat)
	if b.Usage.Input != len(want) || !strings.HasPrefix(b.ID, "resp_") || b.ID == "resp_abc" {
		t.Fatalf("continued: %d input tokens, want %d: %s", b.Usage.Input, len(want), out)
	}

	resp, out = post(t, s.url+"/v1/responses", map[string]any{"model": "m", "previous_response_id": "resp_nope", "input": "x"})
	if resp.StatusCode != 404 || !strings.Contains(string(out), `"message":"Response with id 'resp_nope' not found."`) ||
		!strings.Contains(string(out), `"type":"invalid_request_error"`) || !strings.Contains(string(out), `"param":"response_id"`) {
		t.Fatalf("unknown id: %d %s", resp.StatusCode, out)
	}

	resp, out = post(t, s.url+"/v1/responses", map[string]any{"model": "m", "input": "hi", "instructions": "be brief", "stream": true, "max_output_tokens": 2})
	text := string(out)
	if resp.StatusCode != 200 || !strings.HasPrefix(text, "event: response.created\n") || strings.Count(text, "event: response.output_text.delta\n") != 2 ||
		!strings.Contains(text, "event: response.completed\n") || strings.Contains(text, "[DONE]") {
		t.Fatalf("stream: %d %s", resp.StatusCode, out)
	}
	last := text[strings.LastIndex(text, "data: ")+6:]
	var done struct {
		Response responsesOutBody `json:"response"`
	}
	if json.Unmarshal([]byte(last), &done) != nil || done.Response.Usage.Details.Cached == 0 {
		t.Fatalf("stream's last event: %s (want the response, its repeated prefix cached)", last)
	}

	for _, bad := range []map[string]any{{"model": "m"}, {"model": "m", "input": []any{map[string]any{"type": "function_call", "name": "f"}}}} {
		if resp, out := post(t, s.url+"/v1/responses", bad); resp.StatusCode != 400 {
			t.Errorf("%v: %d %s", bad, resp.StatusCode, out)
		}
	}

	off := startServer(t, Config{ServedModelName: "m"})
	post(t, off.url+"/v1/responses", map[string]any{"model": "m", "input": "hi", "request_id": "resp_x", "max_output_tokens": 1})
	if resp, _ := post(t, off.url+"/v1/responses", map[string]any{"model": "m", "input": "hi", "previous_response_id": "resp_x"}); resp.StatusCode != 404 {
		t.Errorf("store off: %d, want 404", resp.StatusCode)
	}
}

// FuzzResponsesInput: any input is converted or refused, never a panic; a
// converted one is chat messages with a role each, which the fallback
// template renders.
func FuzzResponsesInput(f *testing.F) {
	f.Add([]byte(`"hi"`))
	f.Add([]byte(`[{"role":"user","content":[{"type":"input_text","text":"a"}]},{"type":"message","role":"assistant","content":"b"}]`))
	f.Add([]byte(`[{"type":"function_call"}]`))
	f.Add([]byte(`[{"role":"assistant","content":[]}]`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		msgs, err := responsesInput(raw)
		if err != nil {
			return
		}
		body, _ := json.Marshal(map[string]any{"messages": msgs})
		if _, err := renderChatFallback(body); err != nil && len(msgs) > 0 {
			t.Fatalf("%s -> %s: %v", raw, body, err)
		}
	})
}
