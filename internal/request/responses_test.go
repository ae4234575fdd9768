package request

import (
	"encoding/json"
	"testing"
)

// TestParseResponses: the inputs vLLM renders as a chat become that chat
// (instructions first as a system message, input_text parts kept, an
// assistant item as its first part's text, reasoning.effort as a template
// kwarg); inputs the router cannot render exactly route by load (no chat
// body); malformed fields are OpenAI-shaped 400s naming the field.
func TestParseResponses(t *testing.T) {
	for _, tc := range []struct {
		body, chat, param string // chat "": no chat body
	}{
		{`{"model":"m","input":"hi"}`, `{"messages":[{"content":"hi","role":"user"}],"add_generation_prompt":true}`, ""},
		{`{"model":"m","input":"hi","instructions":"be brief","reasoning":{"effort":"low"}}`,
			`{"messages":[{"content":"be brief","role":"system"},{"content":"hi","role":"user"}],"add_generation_prompt":true,"chat_template_kwargs":{"reasoning_effort":"low"}}`, ""},
		{`{"model":"m","instructions":"","input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"a"}]},{"role":"assistant","content":[{"type":"output_text","text":"b"},{"type":"output_text","text":"c"}]},{"role":"developer","content":"d"}]}`,
			`{"messages":[{"content":[{"type":"input_text","text":"a"}],"role":"user"},{"content":"b","role":"assistant"},{"content":"d","role":"developer"}],"add_generation_prompt":true}`, ""},
		{`{"model":"m","input":[{"type":"function_call","name":"f","arguments":"{}","call_id":"c"}]}`, "", ""},
		{`{"model":"m","input":[{"role":"user","content":[{"type":"input_image","image_url":"x"}]}]}`, "", ""},
		{`{"model":"m","input":[{"role":"assistant","content":"par","status":"incomplete"}]}`, "", ""},
		{`{"model":"m","input":"hi","tools":[{"type":"function","name":"f"}]}`, "", ""},
		{`{"model":"m","input":"hi","previous_response_id":"resp_1"}`, "", ""},
		{`{"model":"m"}`, "", "input"},
		{`{"model":"m","input":[]}`, "", "input"},
		{`{"model":"m","input":7}`, "", "input"},
		{`{"model":"m","input":["x"]}`, "", "input[0]"},
		{`{"model":"m","input":"x","instructions":3}`, "", "instructions"},
		{`{"model":"m","input":"x","previous_response_id":""}`, "", "previous_response_id"},
		{`{"model":"m","input":"x","request_id":5}`, "", "request_id"},
		{`{"model":"m","input":"x","max_output_tokens":-1}`, "", "max_output_tokens"},
	} {
		r, e := Parse(Responses, []byte(tc.body))
		if tc.param != "" {
			if e == nil || e.Param != tc.param || e.Type != InvalidRequest {
				t.Errorf("%s: error %+v, want a 400 on %s", tc.body, e, tc.param)
			}
			continue
		}
		if e != nil {
			t.Fatalf("%s: %v", tc.body, e)
		}
		if got := string(r.Responses.ChatBody); got != tc.chat {
			t.Errorf("%s:\n got chat %s\nwant      %s", tc.body, got, tc.chat)
		}
	}
}

// FuzzParseResponses: any body is accepted or refused with a 400 naming
// a field, never a panic; an accepted one's chat body is a chat request
// with at least one message.
func FuzzParseResponses(f *testing.F) {
	f.Add([]byte(`{"model":"m","input":"hi","instructions":"x"}`))
	f.Add([]byte(`{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"a"}]},{"role":"assistant","content":[{"type":"output_text","text":"b"}]}]}`))
	f.Add([]byte(`{"model":"m","input":[{"type":"function_call"}],"previous_response_id":"p","request_id":"r","max_output_tokens":3}`))
	f.Add([]byte(`{"model":"m","input":[{"role":"assistant","content":[]}],"reasoning":{"effort":null}}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		r, e := Parse(Responses, body)
		if e != nil {
			if e.Type != InvalidRequest {
				t.Fatalf("type %d", e.Type)
			}
			return
		}
		if r.Responses.ChatBody == nil {
			return
		}
		var chat struct {
			Messages []map[string]any `json:"messages"`
		}
		if err := json.Unmarshal(r.Responses.ChatBody, &chat); err != nil || len(chat.Messages) == 0 {
			t.Fatalf("chat body %s: %v", r.Responses.ChatBody, err)
		}
	})
}
