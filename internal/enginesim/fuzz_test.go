package enginesim

import (
	"encoding/json"
	"errors"
	"slices"
	"testing"
)

// FuzzDecodeGenRequest feeds request bodies to the decoders the HTTP API
// uses. Each must fail with errBadRequest or succeed; a successful prompt
// parse round-trips through JSON to the same prompts.
func FuzzDecodeGenRequest(f *testing.F) {
	for _, seed := range []string{
		`{"model":"m","prompt":"hello","max_tokens":5,"stream":true,"stream_options":{"include_usage":true}}`,
		`{"prompt":[1,2,3],"n":2,"cache_salt":"s","vllm_xargs":{"kv_cache_report_mode":"full"}}`,
		`{"prompt":["a",[4,5]],"max_tokens":1}`,
		`{"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"text","text":"x"}]}],"max_completion_tokens":3}`,
		`{"messages":[{"role":"user","content":null}],"add_generation_prompt":false}`,
		`{"prompt":[]}`, `{"prompt":[-1]}`, `{"prompt":[4294967296]}`, `{"n":0}`, `{"cache_salt":""}`,
		`{"vllm_xargs":{"kv_cache_report_mode":3}}`, `[]`, `{`, `{"prompt":"a"} {}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := decodeGenRequest(body)
		if err != nil {
			if !errors.Is(err, errBadRequest) {
				t.Fatalf("error %v does not wrap errBadRequest", err)
			}
			return
		}
		if req.choices() < 1 || req.choices() > maxChoices {
			t.Fatalf("n %d accepted", req.choices())
		}
		if ps, err := parsePrompts(req.Prompt); err == nil {
			again, err := parsePrompts(encodePrompts(ps))
			if err != nil || len(again) != len(ps) {
				t.Fatalf("prompts %+v do not round-trip: %v", ps, err)
			}
			for i := range ps {
				if ps[i].isIDs != again[i].isIDs || ps[i].text != again[i].text || !slices.Equal(ps[i].ids, again[i].ids) {
					t.Fatalf("prompt %d: %+v != %+v", i, ps[i], again[i])
				}
			}
		} else if !errors.Is(err, errBadRequest) {
			t.Fatalf("prompt error %v does not wrap errBadRequest", err)
		}
		if _, err := renderChatFallback(body); err != nil && !errors.Is(err, errBadRequest) {
			t.Fatalf("chat error %v does not wrap errBadRequest", err)
		}
	})
}

// encodePrompts writes prompts back as a JSON list.
func encodePrompts(ps []promptInput) []byte {
	list := make([]any, len(ps))
	for i, p := range ps {
		if p.isIDs {
			list[i] = p.ids
		} else {
			list[i] = p.text
		}
	}
	b, _ := json.Marshal(list)
	return b
}
