package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
	"unicode/utf8"
)

// documentSeeds are the golden chats as request bodies and the shapes
// where a one-pass decode could read a body otherwise than encoding/json.
func documentSeeds(tb testing.TB) [][]byte {
	tb.Helper()
	raw, err := os.ReadFile(qwen3Dir + "/chat.jsonl")
	if err != nil {
		tb.Fatal(err)
	}
	var seeds [][]byte
	for line := range strings.Lines(string(raw)) {
		seeds = append(seeds, []byte(line))
	}
	for _, s := range []string{
		`{}`, ` {"messages":[]} `, `{"messages":null,"tools":null,"chat_template_kwargs":null}`,
		`{"messages":[{"role":"user","content":"x"}],"add_generation_prompt":false,"continue_final_message":null,"chat_template":null}`,
		`{"messages":[{"role":"user","content":"x"}],"add_generation_prompt":"yes"}`,
		`{"messages":[{"role":"user","content":"x"}],"Add_Generation_Prompt":false}`,
		`{"messages":[{"role":"user","content":"x"}],"messages":[]}`,
		`{"messages":[{"role":"user","content":"x","content":"y"}]}`,
		`{"messages":[{"role":"assistant","content":"","tool_calls":[{"function":{"name":"f","arguments":"{\"n\":123456789012345678901234567890}"}}]}]}`,
		`{"messages":[{"role":"user","content":"x"}],"seed":123456789012345678901234567890}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":null}]}],"chat_template_kwargs":{"enable_thinking":false}}`,
		`[]`, `{"a" 1}`, `{"a":1,}`, `{"a":1} x`, "{\"a\":\"\xff\"}",
		"{\"a\":\"caf\xc3\xa9\"}", "{\"caf\xc3\xa9\":1}", "{\"a\":\"x\\n\xe2\x82\xac\"}",
	} {
		seeds = append(seeds, []byte(s))
	}
	return seeds
}

// FuzzDecodeDocument holds DecodeDocument to encoding/json: it accepts
// exactly the JSON objects encoding/json accepts (but nesting beyond 512
// levels and integers Python refuses), each field's value is the field
// decoded alone, and a ChatRequest it makes renders as the one
// ChatRequest.UnmarshalJSON reads from the same body does (the Qwen3
// template: same text, same error).
func FuzzDecodeDocument(f *testing.F) {
	for _, s := range documentSeeds(f) {
		f.Add(s)
	}
	tmpl, err := NewChatTemplate(qwen3TemplateConfig(f))
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if doc, err := DecodeDocument(data); err == nil {
			// ASCII, which spares the router its UTF-8 check, holds
			// exactly when no byte is 0x80 or above.
			ascii := true
			for _, c := range data {
				ascii = ascii && c < utf8.RuneSelf
			}
			if doc.ASCII != ascii {
				t.Fatalf("%q: ASCII %v, want %v", data, doc.ASCII, ascii)
			}
		}
		if !utf8.Valid(data) {
			return // the router refuses invalid UTF-8 before decoding
		}
		doc, err := DecodeDocument(data)
		trimmed := bytes.TrimSpace(data)
		valid := json.Valid(data) && len(trimmed) > 0 && trimmed[0] == '{'
		if err != nil {
			if valid && !errors.Is(err, ErrUnsupported) && !strings.Contains(err.Error(), "nested deeper") {
				t.Fatalf("%q: refused (%v), encoding/json takes it", data, err)
			}
			return
		}
		if !valid {
			t.Fatalf("%q: accepted, encoding/json refuses it", data)
		}
		for _, fl := range doc.Fields {
			want, err := decodeJSONValue(fl.Raw, fl.Key, &bigInts{})
			if err != nil || dumpValue(want) != dumpValue(fl.Value) {
				t.Fatalf("%q: field %s %s, alone %s (%v)", data, fl.Key, dumpValue(fl.Value), dumpValue(want), err)
			}
		}
		req, err := doc.ChatRequest()
		if err != nil || doc.Duplicate {
			return // the router reads such bodies with encoding/json
		}
		var ref ChatRequest
		if err := json.Unmarshal(data, &ref); err != nil {
			t.Fatalf("%q: ChatRequest made, encoding/json refuses it: %v", data, err)
		}
		if !bytes.Equal(req.Messages, ref.Messages) || !bytes.Equal(req.Tools, ref.Tools) ||
			!bytes.Equal(req.ChatTemplateKwargs, ref.ChatTemplateKwargs) || req.AddGenerationPrompt != ref.AddGenerationPrompt ||
			req.ContinueFinalMessage != ref.ContinueFinalMessage || req.ChatTemplate != ref.ChatTemplate {
			t.Fatalf("%q: ChatRequest %+v, encoding/json's %+v", data, req, ref)
		}
		got, gotErr := tmpl.Render(req)
		want, wantErr := tmpl.Render(ref)
		if got != want || (gotErr == nil) != (wantErr == nil) || gotErr != nil && gotErr.Error() != wantErr.Error() {
			t.Fatalf("%q: rendered %q (%v), from the raw fields %q (%v)", data, got, gotErr, want, wantErr)
		}
		again, againErr := tmpl.Render(req) // the document's values are not changed by rendering
		if again != got || (againErr == nil) != (gotErr == nil) {
			t.Fatalf("%q: a second render gave %q (%v), the first %q (%v)", data, again, againErr, got, gotErr)
		}
	})
}

// TestPlainPrefix checks the word-at-a-time scan of the string scanner's
// fast path against a byte loop: every byte value at every position of
// strings of 1-70 bytes (through its 32-, 16- and 8-byte rounds and the
// tail), behind plain bytes and behind a control byte.
func TestPlainPrefix(t *testing.T) {
	want := func(b []byte) int {
		for i, c := range b {
			if c < 0x20 || c >= 0x80 {
				return i
			}
		}
		return len(b)
	}
	for n := 1; n <= 70; n++ {
		for pos := range n {
			for c := range 256 {
				for _, fill := range []byte{'a', ' ', '"', 0x7f} {
					b := bytes.Repeat([]byte{fill}, n)
					b[pos] = byte(c)
					if pos+1 < n {
						b[pos+1] = 0x1f // a borrow after the byte must not move the answer
					}
					if got, w := plainPrefix(b), want(b); got != w {
						t.Fatalf("%q: plainPrefix %d, want %d", b, got, w)
					}
				}
			}
		}
	}
}
