package tokenizer

import (
	"encoding/json"
	"errors"
	"testing"
)

// A chat request of the wrong shape is ErrBadChat with a message in JSON
// terms (what was wanted, what was given), not Go type names.
func TestChatRequestShapeErrors(t *testing.T) {
	for _, tc := range []struct{ body, want string }{
		{`[{"role":"user","content":"Hi"}]`, `malformed chat request: want ` + chatShape + `, got an array (a bare list of messages? wrap it as {"messages":[...]})`},
		{`"Hi"`, `malformed chat request: want ` + chatShape + `, got a string`},
		{`true`, `malformed chat request: want ` + chatShape + `, got a boolean`},
		{` null `, `malformed chat request: want ` + chatShape + `, got null`},
		{`{"messages":[],"add_generation_prompt":1}`, `malformed chat request: add_generation_prompt: want true or false, got a number`},
		{`{"messages":[],"chat_template":["x"]}`, `malformed chat request: chat_template: want a string, got an array`},
		{`{"messages":[],"continue_final_message":{}}`, `malformed chat request: continue_final_message: want true or false, got an object`},
	} {
		var req ChatRequest
		err := json.Unmarshal([]byte(tc.body), &req)
		if !errors.Is(err, ErrBadChat) || err.Error() != tc.want {
			t.Errorf("%s: error %v, want ErrBadChat %q", tc.body, err, tc.want)
		}
	}
	var req ChatRequest
	if err := json.Unmarshal([]byte(`{"messages":[]}`), &req); err != nil || !req.AddGenerationPrompt {
		t.Fatalf("a good request: %v, %+v", err, req)
	}
}
