package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"unicode/utf8"

	"kvrouter/internal/testwait"
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
		// past smallObject fields, with a duplicate found in the index
		`{"a":0,"b":1,"c":2,"d":3,"e":4,"f":5,"g":6,"h":7,"i":8,"j":9,"k":10,"l":11,"m":12,"n":13,"o":14,"p":15,"q":16,"r":17,"c":18,"messages":[]}`,
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

// TestDecodeDocumentManyKeys: a body of many top-level keys decodes in
// time proportional to its keys (200,000 keys took minutes when each was
// compared with every earlier field), and a later duplicate, found in
// the index past smallObject fields or by the scan below it, replaces
// the earlier field: the fields keep their order, the duplicate's at the
// later position, and Duplicate is set.
func TestDecodeDocumentManyKeys(t *testing.T) {
	for _, tt := range []struct {
		name string
		n    int
		dup  int // index of the key repeated at the end; -1: none
	}{{"distinct", 200000, -1}, {"early duplicate", 200000, 3}, {"late duplicate", 200000, 199998}, {"below the index", smallObject - 2, 0}, {"at the index", smallObject, 5}} {
		var b bytes.Buffer
		b.WriteString("{")
		for i := range tt.n {
			fmt.Fprintf(&b, `"k%d":%d,`, i, i)
		}
		if tt.dup >= 0 {
			fmt.Fprintf(&b, `"k%d":"again",`, tt.dup)
		}
		b.WriteString(`"model":"m"}`)
		type result struct {
			doc *Document
			err error
		}
		done := make(chan result, 1)
		go func() {
			doc, err := DecodeDocument(b.Bytes())
			done <- result{doc, err}
		}()
		var r result
		testwait.Within(t, testwait.Default, tt.name+": the decode to end", func() bool {
			select {
			case r = <-done:
				return true
			default:
				return false
			}
		})
		if r.err != nil {
			t.Fatalf("%s: %v", tt.name, r.err)
		}
		doc := r.doc
		if doc.Duplicate != (tt.dup >= 0) || len(doc.Fields) != tt.n+1 {
			t.Fatalf("%s: Duplicate %v, %d fields, want %v and %d", tt.name, doc.Duplicate, len(doc.Fields), tt.dup >= 0, tt.n+1)
		}
		var want []string
		for i := range tt.n {
			if i != tt.dup {
				want = append(want, fmt.Sprintf("k%d", i))
			}
		}
		if tt.dup >= 0 {
			want = append(want, fmt.Sprintf("k%d", tt.dup))
		}
		want = append(want, "model")
		for i, f := range doc.Fields {
			if f.Key != want[i] {
				t.Fatalf("%s: field %d is %q, want %q", tt.name, i, f.Key, want[i])
			}
		}
		if tt.dup >= 0 {
			if f, _ := doc.Get(fmt.Sprintf("k%d", tt.dup)); string(f.Raw) != `"again"` {
				t.Errorf("%s: the duplicate key reads %s, want the later value", tt.name, f.Raw)
			}
		}
	}
}
