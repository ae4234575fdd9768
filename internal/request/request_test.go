package request

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"

	"kvrouter/internal/routing"
)

// FuzzParseRequest: the OpenAI body parser never panics; an accepted body
// is forwarded as a JSON object that says what the client said (model,
// stream, prompt or messages) plus the hit-report mode, and parses again.
func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","prompt":"hello"}`,
		`{"model":"m","prompt":[1,2,3],"stream":true,"max_tokens":4}`,
		`{"model":"m","prompt":[[1,2],[3]],"cache_salt":"s"}`,
		`{"model":"m","prompt":["a","b"],"vllm_xargs":{"x":1}}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"data:,"}}]}]}`,
		`{"model":"m","messages":[],"prompt":123}`,
		`{"model":"m","prompt":"a","vllm_xargs":{"kv_cache_report_mode":"off"}}`,
		` {"model" : "m" , "prompt" : 1.5e3 } `,
		`[]`, `{`, `null`, `{"model":null}`,
	} {
		f.Add(true, []byte(s))
		f.Add(false, []byte(s))
	}
	// Chat requests from the tokenizer golden cases (testdata/tokenizer/qwen3).
	if fh, err := os.Open("../../testdata/tokenizer/qwen3/chat.jsonl"); err == nil {
		sc := bufio.NewScanner(fh)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for n := 0; sc.Scan() && n < 20; n++ {
			var c map[string]json.RawMessage
			if json.Unmarshal(sc.Bytes(), &c) != nil {
				continue
			}
			delete(c, "text")
			delete(c, "ids")
			c["model"] = json.RawMessage(`"m"`)
			b, _ := json.Marshal(c)
			f.Add(true, b)
		}
		fh.Close()
	}
	f.Fuzz(func(t *testing.T, chat bool, body []byte) {
		k := Completion
		if chat {
			k = Chat
		}
		r, aerr := Parse(k, body)
		if aerr != nil {
			if aerr.Type != InvalidRequest || aerr.Message == "" {
				t.Fatalf("bad error %+v", aerr)
			}
			return
		}
		if r.Model == "" {
			t.Fatal("accepted without a model")
		}
		if chat && len(r.messages)+len(r.msgVals) == 0 {
			t.Fatal("chat accepted without messages")
		}
		if !chat && !r.hasPrompt {
			t.Fatal("completion accepted without a prompt")
		}
		fwd, err := r.ForwardBody(true)
		if err != nil {
			return // e.g. a body whose duplicate keys disagree
		}
		var top map[string]json.RawMessage
		if err := json.Unmarshal(fwd, &top); err != nil {
			t.Fatalf("forwarded body is not a JSON object: %v\n%s", err, fwd)
		}
		var x map[string]json.RawMessage
		if err := json.Unmarshal(top["vllm_xargs"], &x); err != nil || x[hitReportKey] == nil {
			t.Fatalf("no %s in %s", hitReportKey, fwd)
		}
		r2, aerr := Parse(k, fwd)
		if aerr != nil {
			t.Fatalf("forwarded body rejected: %v\n%s", aerr, fwd)
		}
		if r2.Model != r.Model || r2.Stream != r.Stream || r2.PromptText != r.PromptText || len(r2.messages)+len(r2.msgVals) != len(r.messages)+len(r.msgVals) ||
			len(r2.PromptTokens) != len(r.PromptTokens) {
			t.Fatalf("forwarded body changed the request:\n%s\n%s", body, fwd)
		}
		if same, _ := r.ForwardBody(false); !bytes.Equal(same, body) {
			t.Fatal("disabled hit report changed the body")
		}
	})
}

func TestAppendIntArray(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []uint32
		ok   bool
	}{
		{"[1,2,3]", []uint32{1, 2, 3}, true},
		{" [ 0 , 4294967295 ]\n", []uint32{0, 4294967295}, true},
		{"[]", nil, true},
		{"[4294967296]", nil, false},
		{"[99999999999]", nil, false},
		{"[01]", nil, false},
		{"[1.0]", nil, false},
		{"[1e3]", nil, false},
		{"[-1]", nil, false},
		{"[1,]", nil, false},
		{"[1 2]", nil, false},
		{"[1]x", nil, false},
		{"[1", nil, false},
		{`["a"]`, nil, false},
	} {
		got, ok := appendIntArray(nil, []byte(tc.in))
		if ok != tc.ok || ok && !slices.Equal(got, tc.want) {
			t.Errorf("appendIntArray(%q) = %v, %v; want %v, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

// FuzzAppendIntArray checks the fast token-id path against encoding/json:
// whatever it accepts, json decodes to the same integers.
func FuzzAppendIntArray(f *testing.F) {
	for _, s := range []string{"[1,2,3]", " [0, 4294967295] ", "[]", "[1e3]", "[01]", "[1.5]", "[-0]"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, ok := appendIntArray(nil, b)
		if !ok {
			return
		}
		var want []float64
		if err := json.Unmarshal(b, &want); err != nil {
			t.Fatalf("fast path accepted %q, json: %v", b, err)
		}
		if len(got) != len(want) {
			t.Fatalf("%q: %v vs json %v", b, got, want)
		}
		for i := range got {
			if float64(got[i]) != want[i] {
				t.Fatalf("%q: %v vs json %v", b, got, want)
			}
		}
	})
}

// TestRoutingText: the text prefix_chars routes by is built as
// production-stack's PrefixAwareRouter.route_request builds it
// (routing_logic.py at a6c01db): chat contents joined by "\n", a content
// list's type "text" parts joined by " ", an absent content as "", a null
// one left out; a completion's string prompt (the first of a batch); a
// token-id prompt as routing.TokenText (our extension).
func TestRoutingText(t *testing.T) {
	for _, tc := range []struct {
		name string
		k    Kind
		body string
		want string
	}{
		{"chat strings", Chat,
			`{"model":"m","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Hi\nthere"},{"role":"assistant","content":"Hello."},{"role":"user","content":"Why?"}]}`,
			"You are terse.\nHi\nthere\nHello.\nWhy?"},
		{"chat parts", Chat,
			`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"look at"},{"type":"image_url","image_url":{"url":"data:x"}},{"type":"text","text":"this"}]},{"role":"user","content":"ok"}]}`,
			"look at this\nok"},
		{"chat part without text", Chat,
			`{"model":"m","messages":[{"role":"user","content":[{"type":"text"},{"type":"text","text":"b"}]}]}`,
			" b"},
		{"chat only non-text parts", Chat,
			`{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:x"}}]},{"role":"user","content":"q"}]}`,
			"\nq"},
		{"chat null content left out", Chat,
			`{"model":"m","messages":[{"role":"system","content":"s"},{"role":"assistant","content":null,"tool_calls":[]},{"role":"user","content":"u"}]}`,
			"s\nu"},
		{"chat absent content is empty", Chat,
			`{"model":"m","messages":[{"role":"system","content":"s"},{"role":"assistant"},{"role":"user","content":"u"}]}`,
			"s\n\nu"},
		{"chat escapes and unicode", Chat,
			`{"model":"m","messages":[{"role":"user","content":"caf\u00e9 \"q\" 日本"}]}`,
			"café \"q\" 日本"},
		{"completion string", Completion, `{"model":"m","prompt":"abc"}`, "abc"},
		{"completion batch", Completion, `{"model":"m","prompt":["first","second"]}`, "first"},
		{"completion token ids", Completion, `{"model":"m","prompt":[1,200,70000]}`,
			routing.TokenText([]uint32{1, 200, 70000})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, e := Parse(tc.k, []byte(tc.body))
			if e != nil {
				t.Fatal(e.Message)
			}
			if got := r.RoutingText(); got != tc.want {
				t.Fatalf("routing text %q, want %q", got, tc.want)
			}
		})
	}
}

// TestOutputTokens: the output budget vLLM checks the context length with
// (build_tok_params): a chat's max_completion_tokens when given, else
// max_tokens; a completion's max_tokens only.
func TestOutputTokens(t *testing.T) {
	tests := []struct {
		k    Kind
		body string
		want int
	}{
		{Chat, `{"model":"m","messages":[{"role":"user","content":"a"}],"max_tokens":10,"max_completion_tokens":5}`, 5},
		{Chat, `{"model":"m","messages":[{"role":"user","content":"a"}],"max_completion_tokens":0,"max_tokens":10}`, 0},
		{Chat, `{"model":"m","messages":[{"role":"user","content":"a"}],"max_tokens":10}`, 10},
		{Chat, `{"model":"m","messages":[{"role":"user","content":"a"}]}`, 0},
		{Completion, `{"model":"m","prompt":"a","max_completion_tokens":50}`, 0},
		{Completion, `{"model":"m","prompt":"a","max_tokens":7,"max_completion_tokens":50}`, 7},
	}
	for _, tt := range tests {
		r, aerr := Parse(tt.k, []byte(tt.body))
		if aerr != nil {
			t.Fatal(aerr)
		}
		if r.OutputTokens != tt.want {
			t.Errorf("%s: outputTokens %d, want %d", tt.body, r.OutputTokens, tt.want)
		}
	}
}

// TestContentEncoding: only an uncompressed body is read; a compressed one
// is refused naming its encoding.
func TestContentEncoding(t *testing.T) {
	for ce, ok := range map[string]bool{"": true, "identity": true, " Identity ": true, "gzip": false, "br": false, "gzip, deflate": false} {
		e := CheckContentEncoding(ce)
		if (e == nil) != ok {
			t.Errorf("%q: error %v, want accepted %v", ce, e, ok)
		}
		if e != nil && (e.Type != InvalidRequest || !strings.Contains(e.Message, ce)) {
			t.Errorf("%q: %+v, want an InvalidRequest naming the encoding", ce, e)
		}
	}
}

// TestByteOrderMark: a body behind a UTF-8 byte order mark parses as the
// body without it, as Python's json.loads reads it.
func TestByteOrderMark(t *testing.T) {
	body := `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
	for _, k := range []Kind{Chat, Completion} {
		b := body
		if k == Completion {
			b = `{"model":"m","prompt":"hi"}`
		}
		want, e := Parse(k, []byte(b))
		if e != nil {
			t.Fatal(e)
		}
		got, e := Parse(k, []byte("\xef\xbb\xbf"+b))
		if e != nil {
			t.Fatalf("kind %v with a byte order mark: %v", k, e)
		}
		if got.Model != want.Model || got.RoutingText() != want.RoutingText() {
			t.Errorf("kind %v: model %q text %q, want %q %q", k, got.Model, got.RoutingText(), want.Model, want.RoutingText())
		}
	}
}

// TestInvalidUTF8: a body with a byte sequence that is not UTF-8 is
// refused, whether the one-pass chat decoder takes it (inside a string),
// fails on it (outside one) or leaves it to encoding/json (a repeated
// key), and for a completion; valid non-ASCII text parses.
func TestInvalidUTF8(t *testing.T) {
	for _, c := range []struct {
		k    Kind
		body string
	}{
		{Chat, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"h\xffi\"}]}"},
		{Chat, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"x\":\xff}"},
		{Chat, "{\"model\":\"m\",\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"h\xc3i\"}]}"},
		{Completion, "{\"model\":\"m\",\"prompt\":\"h\xffi\"}"},
	} {
		_, e := Parse(c.k, []byte(c.body))
		if e == nil || e.Type != InvalidRequest || !strings.Contains(e.Message, "not valid UTF-8") {
			t.Errorf("kind %v %q: %v, want the UTF-8 refusal", c.k, c.body, e)
		}
	}
	r, e := Parse(Chat, []byte("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"caf\xc3\xa9\"}]}"))
	if e != nil || r.RoutingText() != "caf\u00e9" {
		t.Errorf("valid UTF-8: %v, routing text %q", e, r.RoutingText())
	}
}
