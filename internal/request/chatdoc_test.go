package request

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"unicode/utf8"

	"kvrouter/internal/tokenizer"
)

// chatDocSeeds are chat bodies for the one-pass parse: the golden chats
// (testdata/tokenizer/qwen3/chat.jsonl) as requests, the shapes whose
// answers differ between readers (case, duplicates, wrong types), and
// pydantic's integer cases (testdata/pydantic_int.jsonl) as max_tokens and
// max_completion_tokens.
func chatDocSeeds(tb testing.TB) [][]byte {
	tb.Helper()
	seeds := [][]byte{}
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"},{"type":"image_url","image_url":{"url":"data:,"}}]}]}`,
		`{"model":"m","messages":[{"role":"user","content":null},{"role":"assistant"}],"max_tokens":3,"max_completion_tokens":5,"stream":true,"cache_salt":"s","vllm_xargs":{"a":1}}`,
		`{"model":"m","messages":[{"Role":"user","content":"hi"}]}`,
		`{"model":"m","messages":[{"role":"user","CONTENT":"hi"}]}`,
		`{"model":"m","Messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","messages":[{"role":"user","content":"a","content":"b"}]}`,
		`{"model":"m","messages":[{"role":"user","content":[null]}]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":null}]}]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":1}]}]}`,
		`{"model":"m","messages":[{"role":"user","content":[1]}]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":"x"}]}]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":2}}]}]}`,
		`{"model":"m","messages":[{"role":"","content":"x"}]}`,
		`{"model":"m","messages":[{"role":"user","content":5}]}`,
		`{"model":"m","messages":[{"role":"user","content":{"type":"text"}}]}`,
		`{"model":"m","messages":[{"role":5,"content":"x"}]}`,
		`{"model":"m","messages":[{"role":null}]}`,
		`{"model":"m","messages":[null]}`,
		`{"model":"m","messages":{}}`,
		`{"model":"m","messages":[]}`,
		`{"model":"m","messages":null}`,
		`{"model":"m"}`,
		`{"model":1,"messages":[{"role":"user"}]}`,
		`{"model":"","messages":[{"role":"user"}]}`,
		`{"messages":[{"role":"user"}]}`,
		`{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":1.5}`,
		`{"model":"m","messages":[{"role":"user","content":"x"}],"seed":123456789012345678901234567890}`,
		`{"model":"m","messages":[{"role":"user","content":"\ud800 \u00e9"}]}`,
		`{"model":"m","messages":[{"role":"user","content":"x"}]} x`,
		`{"model":"m","messages":[{"role":"user","content":"x"}],}`,
	} {
		seeds = append(seeds, []byte(s))
	}
	for _, c := range pydanticCases(tb) {
		for _, field := range []string{"max_tokens", "max_completion_tokens"} {
			seeds = append(seeds, []byte(`{"model":"m","messages":[{"role":"user","content":"x"}],"`+field+`":`+c.JSON+`}`))
		}
	}
	fh, err := os.Open("../../testdata/tokenizer/qwen3/chat.jsonl")
	if err != nil {
		tb.Fatal(err)
	}
	defer fh.Close()
	sc := bufio.NewScanner(fh)
	sc.Buffer(make([]byte, 1<<20), 1<<22)
	for sc.Scan() {
		var c map[string]json.RawMessage
		if json.Unmarshal(sc.Bytes(), &c) != nil {
			continue
		}
		delete(c, "text")
		delete(c, "ids")
		c["model"] = json.RawMessage(`"m"`)
		b, _ := json.Marshal(c)
		seeds = append(seeds, b)
	}
	return seeds
}

// sameParse reports how the one-pass parse of body differs from the
// encoding/json one ("" when it does not): the same 400 (message and
// param), or the same request (routing fields, message count, the text
// prefix_chars routes by, the media scan, the forwarded body).
func sameParse(body []byte) string {
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) == 0 || trimmed[0] != '{' || !utf8.Valid(trimmed) {
		return ""
	}
	fast, fe, ok := parseChatDoc(body, trimmed)
	if !ok {
		return ""
	}
	ref, re := parseRequestJSON(Chat, body, trimmed)
	if (fe == nil) != (re == nil) {
		return fmt.Sprintf("error %v, encoding/json's %v", fe, re)
	}
	if fe != nil {
		if fe.Message != re.Message || fe.Param != re.Param || (fast == nil) != (ref == nil) || fast != nil && fast.Model != ref.Model {
			return fmt.Sprintf("error %q (%s), encoding/json's %q (%s)", fe.Message, fe.Param, re.Message, re.Param)
		}
		return ""
	}
	if fast.Model != ref.Model || fast.Stream != ref.Stream || fast.CacheSalt != ref.CacheSalt || fast.MaxTokens != ref.MaxTokens ||
		fast.OutputTokens != ref.OutputTokens || !bytes.Equal(fast.xargs, ref.xargs) {
		return fmt.Sprintf("fields %+v, encoding/json's %+v", fast, ref)
	}
	if len(fast.msgVals) != len(ref.messages) {
		return fmt.Sprintf("%d messages, encoding/json's %d", len(fast.msgVals), len(ref.messages))
	}
	if a, b := fast.RoutingText(), ref.RoutingText(); a != b {
		return fmt.Sprintf("routing text %q, encoding/json's %q", a, b)
	}
	if a, b := fast.Media(), ref.Media(); !reflect.DeepEqual(a, b) {
		return fmt.Sprintf("media %+v, encoding/json's %+v", a, b)
	}
	a, errA := fast.ForwardBody(true)
	b, errB := ref.ForwardBody(true)
	if !bytes.Equal(a, b) || (errA == nil) != (errB == nil) {
		return "forwarded bodies differ"
	}
	return ""
}

// TestChatDocSameAsJSON: the one-pass chat parse answers every seed as
// the encoding/json parse does, and takes the common bodies.
func TestChatDocSameAsJSON(t *testing.T) {
	for _, body := range chatDocSeeds(t) {
		if d := sameParse(body); d != "" {
			t.Errorf("%s: %s", body, d)
		}
	}
	for _, body := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"}]}],"tools":[{"type":"function"}]}`,
	} {
		if _, _, ok := parseChatDoc([]byte(body), []byte(body)); !ok {
			t.Errorf("%s: left to encoding/json", body)
		}
	}
	for _, body := range []string{
		`{"model":"m","messages":[{"Role":"user","content":"hi"}]}`,
		`{"model":"m","messages":[{"role":"user","content":"a","content":"b"}]}`,
		`{"model":"m","messages":[{"role":"user","content":"x"}],}`,
	} {
		if _, _, ok := parseChatDoc([]byte(body), []byte(body)); ok {
			t.Errorf("%s: taken by the one-pass parse; encoding/json must answer it", body)
		}
	}
}

// FuzzChatDoc holds the one-pass chat parse to the encoding/json one.
func FuzzChatDoc(f *testing.F) {
	for _, s := range chatDocSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		if d := sameParse(body); d != "" {
			t.Fatalf("%s: %s", body, d)
		}
	})
}

// TestChatValueBound: a chat body of many small JSON values, anywhere in
// it, is refused once it passes tokenizer.MaxJSONValues, before its
// decoding costs more than a bounded amount (unbounded, 1.4M numbers took
// about 200 MB to decode), and without a second decode.
func TestChatValueBound(t *testing.T) {
	many := "[" + strings.Repeat("1,", 1400000) + "1]"
	for name, body := range map[string]string{
		"unknown field":        `{"model":"m","messages":[{"role":"user","content":"hi"}],"x":` + many + `}`,
		"chat_template_kwargs": `{"model":"m","messages":[{"role":"user","content":"hi"}],"chat_template_kwargs":{"x":` + many + `}}`,
		"message":              `{"model":"m","messages":[{"role":"user","content":"hi","x":` + many + `}]}`,
	} {
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		_, e := Parse(Chat, []byte(body))
		runtime.ReadMemStats(&m1)
		if e == nil || e.Type != InvalidRequest || !strings.Contains(e.Message, "JSON values") {
			t.Errorf("%s: %v, want an InvalidRequest naming the JSON values", name, e)
		}
		if mb := (m1.TotalAlloc - m0.TotalAlloc) >> 20; mb > 64 {
			t.Errorf("%s: decoding a %d KB body allocated %d MB, want at most 64", name, len(body)>>10, mb)
		}
	}
	// Just under the bound: decoded and routed as usual.
	under := `{"model":"m","messages":[{"role":"user","content":"hi"}],"x":[` + strings.Repeat("1,", tokenizer.MaxJSONValues-20) + `1]}`
	if _, e := Parse(Chat, []byte(under)); e != nil {
		t.Errorf("a body of %d values: %v", tokenizer.MaxJSONValues-10, e)
	}
}
