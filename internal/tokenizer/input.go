package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// EncodeInput is "kvrouter tokenize": it loads the tokenizer at path
// (Load) and encodes input, plain text taken byte for byte (with the
// model's special tokens unless noSpecial), or with chat a JSON chat
// request {"messages", "tools", "add_generation_prompt" (default true),
// "chat_template_kwargs"} rendered with the model's chat template and
// encoded without added special tokens, as vLLM encodes chats; text is
// then the rendered prompt (nil for plain text). ids is never nil.
func EncodeInput(path string, input []byte, chat, noSpecial bool) (ids []uint32, text *string, err error) {
	var req ChatRequest
	if chat {
		if len(bytes.TrimSpace(input)) == 0 {
			return nil, nil, errors.New(`chat request on stdin: empty; want a JSON object {"messages":[...], ...}`)
		}
		if err := json.Unmarshal(input, &req); err != nil {
			return nil, nil, fmt.Errorf("chat request on stdin: %w", err)
		}
	}
	tok, err := Load(path)
	if err != nil {
		return nil, nil, err
	}
	if chat {
		local, err := NewLocal(tok, ContentAuto)
		if err != nil {
			return nil, nil, err
		}
		t, ids, err := local.EncodeChat(req)
		if err != nil {
			return nil, nil, err
		}
		text = &t
		if ids == nil {
			ids = []uint32{}
		}
		return ids, text, nil
	}
	ids = tok.Encode(string(input), !noSpecial)
	if ids == nil {
		ids = []uint32{}
	}
	return ids, nil, nil
}
