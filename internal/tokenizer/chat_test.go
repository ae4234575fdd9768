package tokenizer

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ardanlabs/jinja"
)

const qwen3Dir = "../../testdata/tokenizer/qwen3"

// chatCase is one line of testdata/tokenizer/qwen3/chat.jsonl.
type chatCase struct {
	Messages            json.RawMessage `json:"messages"`
	Tools               json.RawMessage `json:"tools"`
	AddGenerationPrompt bool            `json:"add_generation_prompt"`
	ChatTemplateKwargs  json.RawMessage `json:"chat_template_kwargs"`
	Text                string          `json:"text"`
	IDs                 []uint32        `json:"ids"`
}

func (c chatCase) request() ChatRequest {
	return ChatRequest{
		Messages:            c.Messages,
		Tools:               c.Tools,
		AddGenerationPrompt: c.AddGenerationPrompt,
		ChatTemplateKwargs:  c.ChatTemplateKwargs,
	}
}

func loadChatCases(t testing.TB) []chatCase {
	t.Helper()
	f, err := os.Open(qwen3Dir + "/chat.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var cases []chatCase
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<24)
	for sc.Scan() {
		var c chatCase
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			t.Fatalf("chat.jsonl line %d: %v", len(cases)+1, err)
		}
		cases = append(cases, c)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return cases
}

// qwen3TemplateConfig reads tokenizer_config.json directly, so the template
// tests need nothing but that file.
func qwen3TemplateConfig(t testing.TB) ChatTemplateConfig {
	t.Helper()
	raw, err := os.ReadFile(qwen3Dir + "/tokenizer_config.json")
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		ChatTemplate json.RawMessage `json:"chat_template"`
		EOS          string          `json:"eos_token"`
	}
	if err := json.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	return ChatTemplateConfig{Source: cfg.ChatTemplate, EOSToken: cfg.EOS}
}

func TestChatTemplateQwen3Golden(t *testing.T) {
	tmpl, err := NewChatTemplate(qwen3TemplateConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	if got := tmpl.ContentFormat(); got != ContentString {
		t.Errorf("content format = %q, want string", got)
	}
	cases := loadChatCases(t)
	if len(cases) != 40 {
		t.Fatalf("chat.jsonl has %d cases, want 40", len(cases))
	}
	for i, c := range cases {
		got, err := tmpl.Render(c.request())
		if err != nil {
			t.Errorf("case %d: %v", i, err)
			continue
		}
		if got != c.Text {
			t.Errorf("case %d: text differs at byte %d\n got: %q\nwant: %q", i, firstDiff(got, c.Text), got, c.Text)
		}
	}
}

func firstDiff(a, b string) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

func mustTemplate(t *testing.T, src string) *ChatTemplate {
	t.Helper()
	raw, _ := json.Marshal(src)
	tmpl, err := NewChatTemplate(ChatTemplateConfig{
		Source: raw, BOSToken: "<s>", EOSToken: "</s>",
		Now: func() time.Time { return time.Date(2026, 3, 5, 14, 7, 9, 0, time.UTC) },
	})
	if err != nil {
		t.Fatal(err)
	}
	return tmpl
}

func TestChatTemplateBehaviour(t *testing.T) {
	tests := []struct {
		name, template string
		req            string
		want           string
		wantErr        error
	}{
		{
			name:     "tojson keeps key order and python separators",
			template: `{{ messages[0].tool_calls[0].function.arguments | tojson }}`,
			req:      `{"messages":[{"role":"assistant","content":"","tool_calls":[{"function":{"name":"f","arguments":"{\"z\": 1, \"a\": [1.0, 2.5e-07, \"é<>&\"]}"}}]}]}`,
			want:     `{"z": 1, "a": [1.0, 2.5e-07, "é<>&"]}`,
		},
		{
			name:     "tojson indent",
			template: `{{ tools[0] | tojson(indent=2) }}`,
			req:      `{"messages":[],"tools":[{"b":1,"a":{"c":[]}}]}`,
			want:     "{\n  \"b\": 1,\n  \"a\": {\n    \"c\": []\n  }\n}",
		},
		{
			name:     "empty and null arguments become {}",
			template: `{% for c in messages[0].tool_calls %}{{ c.function.arguments | tojson }};{% endfor %}`,
			req:      `{"messages":[{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":""}},{"function":{"name":"g","arguments":null}},{"function":{"name":"h"}}]}]}`,
			want:     `{};{};{};`,
		},
		{
			name:     "empty tool_calls dropped",
			template: `{{ messages[0].tool_calls is defined }}`,
			req:      `{"messages":[{"role":"assistant","content":"x","tool_calls":[]}]}`,
			want:     `False`,
		},
		{
			name:     "bad arguments JSON",
			template: `x`,
			req:      `{"messages":[{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"{oops"}}]}]}`,
			wantErr:  ErrBadChat,
		},
		{
			name:     "content parts joined, null content is empty",
			template: `{% for m in messages %}[{{ m.content }}]{% endfor %}`,
			req:      `{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},{"role":"assistant","content":null}]}`,
			want:     "[a\nb][]",
		},
		{
			name:     "image part unsupported",
			template: `x`,
			req:      `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:"}}]}]}`,
			wantErr:  ErrUnsupported,
		},
		{
			name:     "reasoning mirrored to reasoning_content",
			template: `{{ messages[0].reasoning_content }}`,
			req:      `{"messages":[{"role":"assistant","content":"a","reasoning":"because"}]}`,
			want:     `because`,
		},
		{
			name:     "special tokens, generation prompt default true, kwargs merged",
			template: "{{ bos_token }}{% if add_generation_prompt %}G{% endif %}{{ flavour }}{{ eos_token }}",
			req:      `{"messages":[],"chat_template_kwargs":{"flavour":"mint"}}`,
			want:     `<s>Gmint</s>`,
		},
		{
			name:     "kwargs override add_generation_prompt like vLLM",
			template: "{{ add_generation_prompt }}",
			req:      `{"messages":[],"add_generation_prompt":true,"chat_template_kwargs":{"add_generation_prompt":false}}`,
			want:     `False`,
		},
		{
			name:     "kwargs may not set messages",
			template: "x",
			req:      `{"messages":[],"chat_template_kwargs":{"messages":[]}}`,
			wantErr:  ErrBadChat,
		},
		{
			name:     "raise_exception",
			template: "{{ raise_exception('no system role') }}",
			req:      `{"messages":[]}`,
			wantErr:  errAny,
		},
		{
			name:     "strftime_now",
			template: `{{ strftime_now("%d %b %Y") }}|{{ strftime_now("%-d %B %y %H:%M:%S %A %j %%") }}`,
			req:      `{"messages":[]}`,
			want:     `05 Mar 2026|5 March 26 14:07:09 Thursday 064 %`,
		},
		{
			name:     "trim_blocks and lstrip_blocks",
			template: "{% for m in messages %}\n    {% if m.role %}\n{{ m.role }}\n    {% endif %}\n{% endfor %}",
			req:      `{"messages":[{"role":"user","content":"x"},{"role":"assistant","content":"y"}]}`,
			want:     "user\nassistant\n",
		},
		{
			name:     "loopcontrols",
			template: "{% for m in messages %}{% if loop.index0 == 1 %}{% continue %}{% endif %}{% if loop.index0 == 2 %}{% break %}{% endif %}{{ m.content }}{% endfor %}",
			req:      `{"messages":[{"role":"user","content":"a"},{"role":"user","content":"b"},{"role":"user","content":"c"}]}`,
			want:     "a",
		},
		// Expected strings of the next four: Python 3.11's json.loads, then
		// json.dumps(ensure_ascii=False) (transformers' tojson) and str()
		// (what {{ }} prints), run with Debian's /usr/bin/python3.
		{
			name: "integers beyond int64 printed as Python prints them",
			template: `{{ a | tojson }}|{{ a.n }}|{{ a.m | string }}|{{ a }}|` +
				`{% if a.n > 5 and a.m < -5 and a.n > a.k and a.k > a.x and a.n == a.n2 and a.m < a.k %}ordered{% endif %}|{{ a.n is integer }}`,
			req: `{"messages":[],"chat_template_kwargs":{"a":{"n":123456789012345678901234567890,"m":-123456789012345678901234567890,` +
				`"k":9223372036854775808,"n2":123456789012345678901234567890,"x":7}}}`,
			want: `{"n": 123456789012345678901234567890, "m": -123456789012345678901234567890, "k": 9223372036854775808, "n2": 123456789012345678901234567890, "x": 7}` +
				`|123456789012345678901234567890|-123456789012345678901234567890|` +
				`{'n': 123456789012345678901234567890, 'm': -123456789012345678901234567890, 'k': 9223372036854775808, 'n2': 123456789012345678901234567890, 'x': 7}` +
				`|ordered|True`,
		},
		{
			name:     "arithmetic on an integer beyond int64 left to the engine",
			template: `{{ a.n + 1 }}`,
			req:      `{"messages":[],"chat_template_kwargs":{"a":{"n":123456789012345678901234567890}}}`,
			wantErr:  ErrUnsupported,
		},
		{
			name:     "an integer of more digits than Python converts left to the engine",
			template: `{{ a.n }}`,
			req:      `{"messages":[],"chat_template_kwargs":{"a":{"n":1` + strings.Repeat("0", 4300) + `}}}`,
			wantErr:  ErrUnsupported,
		},
		{
			name:     "floats beyond float64 are inf, below it 0.0, as json.loads makes them",
			template: `{{ a | tojson }}|{{ a.i }} {{ a.j }} {{ a.z }}|{{ a }}`,
			req:      `{"messages":[],"chat_template_kwargs":{"a":{"i":1e400,"j":-1e400,"z":1e-400}}}`,
			want:     `{"i": Infinity, "j": -Infinity, "z": 0.0}|inf -inf 0.0|{'i': inf, 'j': -inf, 'z': 0.0}`,
		},
		{
			name:     "continue_final_message left to the engine",
			template: `x`,
			req:      `{"messages":[{"role":"assistant","content":"Once upon"}],"continue_final_message":true,"add_generation_prompt":false}`,
			wantErr:  ErrUnsupported,
		},
		{
			name:     "messages not a list",
			template: `x`,
			req:      `{"messages":{"role":"user"}}`,
			wantErr:  ErrBadChat,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var req ChatRequest
			if err := json.Unmarshal([]byte(tt.req), &req); err != nil {
				t.Fatal(err)
			}
			got, err := mustTemplate(t, tt.template).Render(req)
			switch {
			case tt.wantErr == errAny && err == nil:
				t.Fatalf("Render = %q, want an error", got)
			case tt.wantErr == errAny:
			case tt.wantErr != nil && !errors.Is(err, tt.wantErr):
				t.Fatalf("Render error = %v, want %v", err, tt.wantErr)
			case tt.wantErr == nil && err != nil:
				t.Fatalf("Render: %v", err)
			case got != tt.want:
				t.Fatalf("Render = %q, want %q", got, tt.want)
			}
		})
	}
}

var errAny = errors.New("any error")

func TestChatTemplateNamed(t *testing.T) {
	src := `[{"name":"default","template":"D{{ messages|length }}"},{"name":"tool_use","template":"T{{ tools|length }}"}]`
	tmpl, err := NewChatTemplate(ChatTemplateConfig{Source: json.RawMessage(src)})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ req, want string }{
		{`{"messages":[{"role":"user","content":"x"}]}`, "D1"},
		{`{"messages":[],"tools":[{"type":"function"}]}`, "T1"},
		{`{"messages":[],"tools":[]}`, "D0"},
	} {
		var req ChatRequest
		if err := json.Unmarshal([]byte(tc.req), &req); err != nil {
			t.Fatal(err)
		}
		got, err := tmpl.Render(req)
		if err != nil || got != tc.want {
			t.Errorf("Render(%s) = %q, %v; want %q", tc.req, got, err, tc.want)
		}
	}
	_, err = NewChatTemplate(ChatTemplateConfig{Source: json.RawMessage(`[{"name":"tool_use","template":"x"}]`)})
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{``, `null`} {
		if _, err := NewChatTemplate(ChatTemplateConfig{Source: json.RawMessage(bad)}); !errors.Is(err, ErrNoChatTemplate) {
			t.Errorf("NewChatTemplate(%q) error = %v, want ErrNoChatTemplate", bad, err)
		}
	}
	if _, err := NewChatTemplate(ChatTemplateConfig{Source: json.RawMessage(`"{% if %}"`)}); err == nil {
		t.Error("NewChatTemplate of a broken template: no error")
	}
}

func TestContentFormatOpenAI(t *testing.T) {
	src, _ := json.Marshal(`{% for m in messages %}{% for p in m['content'] %}<{{ p.type }}:{{ p.text }}>{% endfor %}{% endfor %}`)
	tmpl, err := NewChatTemplate(ChatTemplateConfig{Source: src})
	if err != nil {
		t.Fatal(err)
	}
	if tmpl.ContentFormat() != ContentOpenAI {
		t.Fatalf("content format = %q, want openai", tmpl.ContentFormat())
	}
	var req ChatRequest
	if err := json.Unmarshal([]byte(`{"messages":[{"role":"user","content":"hi"},{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":null}]}]}`), &req); err != nil {
		t.Fatal(err)
	}
	got, err := tmpl.Render(req)
	if want := "<text:hi><text:a>"; err != nil || got != want {
		t.Fatalf("Render = %q, %v; want %q", got, err, want)
	}
}

// FuzzChatRequest feeds arbitrary bytes through the chat request decoding
// and rendering path: it must return an error or a render, never panic.
func FuzzChatRequest(f *testing.F) {
	raw, err := os.ReadFile(qwen3Dir + "/chat.jsonl")
	if err != nil {
		f.Fatal(err)
	}
	for line := range strings.Lines(string(raw)) {
		f.Add([]byte(line))
	}
	f.Add([]byte(`{"messages":[{"role":"assistant","tool_calls":[{"function":{"arguments":"[[[["}}]}]}`))
	f.Add([]byte(`{"messages":[{"role":"user","content":[{"type":"text","text":1}]}],"chat_template_kwargs":[]}`))
	f.Add([]byte(`{"messages":[{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"{\"n\":-123456789012345678901234567890,\"f\":1e400}"}}]}],"tools":[{"x":18446744073709551616}]}`))
	tmpl, err := NewChatTemplate(qwen3TemplateConfig(f))
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var req ChatRequest
		if err := json.Unmarshal(data, &req); err != nil {
			return
		}
		_, _ = tmpl.Render(req)
	})
}

// TestEncodeChatQwen3Golden checks text and ids of every chat.jsonl case
// through Load + NewLocal, the path the router uses.
func TestEncodeChatQwen3Golden(t *testing.T) {
	l := sharedQwen3(t)
	for i, c := range loadChatCases(t) {
		text, ids, err := l.EncodeChat(c.request())
		if err != nil {
			t.Errorf("case %d: %v", i, err)
			continue
		}
		if text != c.Text {
			t.Errorf("case %d: text differs at byte %d", i, firstDiff(text, c.Text))
		}
		if !equalIDs(ids, c.IDs) {
			t.Errorf("case %d: ids differ\n got: %v\nwant: %v", i, ids, c.IDs)
		}
	}
}

// BenchmarkEncodeChat renders and encodes typical chats with the Qwen3
// template: chat.jsonl line 31 (system prompt and 11 turns) and line 30
// (a tool definition and a tool call with nested arguments). Run with
//
//	go test -run '^$' -bench 'EncodeChat|RenderChat' -benchtime 1s -count 1 ./internal/tokenizer/
func BenchmarkEncodeChat(b *testing.B) {
	l := sharedQwen3(b)
	cases := loadChatCases(b)
	for _, bc := range []struct {
		name string
		line int
	}{{"turns=12", 31}, {"tools=1", 30}} {
		req := cases[bc.line].request()
		b.Run(bc.name, func(b *testing.B) {
			_, ids, err := l.EncodeChat(req)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, _, err := l.EncodeChat(req); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(ids)*b.N)/b.Elapsed().Seconds(), "tokens/s")
		})
	}
}

// BenchmarkRenderChat is the template render alone (no encoding).
func BenchmarkRenderChat(b *testing.B) {
	tmpl, err := NewChatTemplate(qwen3TemplateConfig(b))
	if err != nil {
		b.Fatal(err)
	}
	req := loadChatCases(b)[31].request()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := tmpl.Render(req); err != nil {
			b.Fatal(err)
		}
	}
}

// refDecodeJSONValue is the encoding/json-based decoder the scanner
// replaced; FuzzDecodeJSONValue holds the scanner to it.
func refDecodeJSONValue(data []byte, field string, ints *bigInts) (jinja.Value, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	v, err := refDecodeValue(dec, 0, ints)
	if err == nil {
		if _, e := dec.Token(); e != io.EOF {
			err = fmt.Errorf("%w: trailing data", ErrBadChat)
		}
	}
	if err != nil {
		if !errors.Is(err, ErrBadChat) && !errors.Is(err, ErrUnsupported) {
			err = fmt.Errorf("%w: %v", ErrBadChat, err)
		}
		return jinja.Undefined(), fmt.Errorf("%s: %w", field, err)
	}
	return v, nil
}

func refDecodeValue(dec *json.Decoder, depth int, ints *bigInts) (jinja.Value, error) {
	if depth > maxJSONDepth {
		return jinja.Undefined(), fmt.Errorf("%w: nested deeper than %d", ErrBadChat, maxJSONDepth)
	}
	tok, err := dec.Token()
	if err != nil {
		return jinja.Undefined(), err
	}
	switch t := tok.(type) {
	case nil:
		return jinja.None(), nil
	case bool:
		return jinja.NewBool(t), nil
	case string:
		return jinja.NewString(t), nil
	case json.Number:
		return numberValue(string(t), ints)
	case json.Delim:
		if t == '[' {
			items := []jinja.Value{}
			for dec.More() {
				v, err := refDecodeValue(dec, depth+1, ints)
				if err != nil {
					return jinja.Undefined(), err
				}
				items = append(items, v)
			}
			_, err := dec.Token()
			return jinja.NewList(items), err
		}
		obj := jinja.NewDict()
		d := obj.AsDict()
		for dec.More() {
			k, err := dec.Token()
			if err != nil {
				return jinja.Undefined(), err
			}
			v, err := refDecodeValue(dec, depth+1, ints)
			if err != nil {
				return jinja.Undefined(), err
			}
			d.Set(k.(string), v) // a later duplicate key wins in place, as in Python
		}
		_, err := dec.Token()
		return obj, err
	}
	return jinja.Undefined(), fmt.Errorf("%w: unexpected token %v", ErrBadChat, tok)
}

// dumpValue prints v with its kinds, so 1 and 1.0 differ.
func dumpValue(v jinja.Value) string {
	switch {
	case v.IsList():
		parts := []string{}
		for _, it := range v.AsList().Items {
			parts = append(parts, dumpValue(it))
		}
		return "[" + strings.Join(parts, ",") + "]"
	case v.IsDict():
		parts := []string{}
		for _, k := range v.AsDict().Keys {
			parts = append(parts, strconv.Quote(k)+":"+dumpValue(v.AsDict().Data[k]))
		}
		return "{" + strings.Join(parts, ",") + "}"
	case v.IsInt():
		return "i" + strconv.FormatInt(v.AsInt(), 10)
	case v.IsFloat():
		return "f" + strconv.FormatFloat(v.AsFloat(), 'g', -1, 64)
	case v.IsString():
		return strconv.Quote(v.AsString())
	}
	return v.String()
}

// FuzzDecodeJSONValue checks the scanner against encoding/json: same
// acceptance, same values (kinds, key order, strings after U+FFFD repair).
func FuzzDecodeJSONValue(f *testing.F) {
	raw, err := os.ReadFile(qwen3Dir + "/chat.jsonl")
	if err != nil {
		f.Fatal(err)
	}
	for line := range strings.Lines(string(raw)) {
		f.Add([]byte(line))
	}
	for _, s := range []string{`"\ud83d\ude00 \ud800 \udc00\u0041 \ud800\ud800"`, "\"\xff\xfe\"", `[1, 1.0, -0, 1e5, 1E+5, 12345678901234567890]`,
		`[123456789012345678901234567890, -123456789012345678901234567890, 9223372036854775808, -9223372036854775809, 1e400, -1e400, 1e-400]`,
		`{"a":1,"a":2,"b":{}}`, ` [ ] `, `01`, `1.`, `"\/\b\f"`, `[1,]`, `{"a" 1}`, `nul`, `[[[[[[]]]]]]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		gotInts, wantInts := &bigInts{}, &bigInts{}
		got, gotErr := decodeJSONValue(data, "x", gotInts)
		want, wantErr := refDecodeJSONValue(data, "x", wantInts)
		if (gotErr == nil) != (wantErr == nil) {
			t.Fatalf("%q: scanner error %v, encoding/json error %v", data, gotErr, wantErr)
		}
		if gotErr == nil && dumpValue(got) != dumpValue(want) {
			t.Fatalf("%q: scanner %s, encoding/json %s", data, dumpValue(got), dumpValue(want))
		}
		if gotErr == nil && (!maps.Equal(gotInts.seen, wantInts.seen) || gotInts.maxAbs != wantInts.maxAbs) {
			t.Fatalf("%q: scanner found integers beyond int64 %v (max other %d), encoding/json %v (%d)",
				data, gotInts.seen, gotInts.maxAbs, wantInts.seen, wantInts.maxAbs)
		}
	})
}

// TestDecodeLongStrings checks strings with escapes (each decoded into a
// builder sized to its raw bytes up to the first quote) against
// encoding/json: escapes that shrink them, invalid UTF-8 that grows them
// past their raw length, an escaped quote before the end (a builder sized
// short), and several in one array (each its own buffer).
func TestDecodeLongStrings(t *testing.T) {
	const ownStringMin = 256 // once the length above which a string had a buffer of its own
	long := strings.Repeat("word ", ownStringMin/4)
	cases := []string{
		`"` + long + `\n\n` + long + `"`,
		`"` + long + `\"` + long + `\"` + long + `"`,
		"\"" + long + strings.Repeat("\xff", 2*ownStringMin) + "\\n\"",
		`"` + long + `\ud83d\ude00\u00e9\t` + long + `"`,
		`["` + long + `\n", "` + long + `\\", "short\n", "` + long + `\/"]`,
		`{"content": "` + long + `\n` + long + `", "role": "user"}`,
		`["a\"b", "\"\"\"\"", "x\u00e9\n\"", "\ud83d\ude00", "` + "\xff\xfe" + `\t"]`,
	}
	for _, c := range cases {
		got, err := decodeJSONValue([]byte(c), "x", &bigInts{})
		want, wantErr := refDecodeJSONValue([]byte(c), "x", &bigInts{})
		if err != nil || wantErr != nil || dumpValue(got) != dumpValue(want) {
			t.Errorf("%.40q...: scanner %.80s (%v), encoding/json %.80s (%v)", c, dumpValue(got), err, dumpValue(want), wantErr)
		}
	}
}
