package proxy

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"slices"
	"testing"
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
		k := kindCompletion
		if chat {
			k = kindChat
		}
		r, aerr := parseRequest(k, body)
		if aerr != nil {
			if aerr.status != 400 || aerr.message == "" || !json.Valid(aerr.body()) {
				t.Fatalf("bad error %+v", aerr)
			}
			return
		}
		if r.model == "" {
			t.Fatal("accepted without a model")
		}
		if chat && len(r.messages)+len(r.msgVals) == 0 {
			t.Fatal("chat accepted without messages")
		}
		if !chat && !r.hasPrompt {
			t.Fatal("completion accepted without a prompt")
		}
		fwd, err := r.forwardBody(true)
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
		r2, aerr := parseRequest(k, fwd)
		if aerr != nil {
			t.Fatalf("forwarded body rejected: %v\n%s", aerr, fwd)
		}
		if r2.model != r.model || r2.stream != r.stream || r2.promptText != r.promptText || len(r2.messages)+len(r2.msgVals) != len(r.messages)+len(r.msgVals) ||
			len(r2.promptTokens) != len(r.promptTokens) {
			t.Fatalf("forwarded body changed the request:\n%s\n%s", body, fwd)
		}
		if same, _ := r.forwardBody(false); !bytes.Equal(same, body) {
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

// TestValidation: requests the router refuses itself, in OpenAI's error
// shape with the field named; valid odd shapes are forwarded.
func TestValidation(t *testing.T) {
	rg := newRig(t, 1)
	tests := []struct {
		name, path, body string
		status           int
		param            string
	}{
		{"malformed JSON", "/v1/chat/completions", `{"model":`, 400, ""},
		{"not an object", "/v1/chat/completions", `[1]`, 400, ""},
		{"missing model", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}]}`, 400, "model"},
		{"model not a string", "/v1/completions", `{"model":1,"prompt":"x"}`, 400, "model"},
		{"empty messages", "/v1/chat/completions", `{"model":"m","messages":[]}`, 400, "messages"},
		{"missing messages", "/v1/chat/completions", `{"model":"m"}`, 400, "messages"},
		{"message not object", "/v1/chat/completions", `{"model":"m","messages":["hi"]}`, 400, "messages[0]"},
		{"missing role", "/v1/chat/completions", `{"model":"m","messages":[{"content":"hi"}]}`, 400, "messages[0].role"},
		{"content number", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":5}]}`, 400, "messages[0].content"},
		{"prompt 123", "/v1/completions", `{"model":"m","prompt":123}`, 400, "prompt"},
		{"prompt missing", "/v1/completions", `{"model":"m"}`, 400, "prompt"},
		{"prompt empty list", "/v1/completions", `{"model":"m","prompt":[]}`, 400, "prompt"},
		{"prompt negative id", "/v1/completions", `{"model":"m","prompt":[1,-2]}`, 400, "prompt"},
		{"prompt mixed", "/v1/completions", `{"model":"m","prompt":["a",1]}`, 400, "prompt"},
		{"stream not bool", "/v1/completions", `{"model":"m","prompt":"a","stream":"yes"}`, 400, "stream"},
		{"xargs not object", "/v1/completions", `{"model":"m","prompt":"a","vllm_xargs":3}`, 400, "vllm_xargs"},
		{"unknown model", "/v1/completions", `{"model":"nope","prompt":"a"}`, 404, "model"},
		{"image-only content routed by load", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}]}`, 200, ""},
		{"batch of token prompts", "/v1/completions", `{"model":"m","prompt":[[1,2],[3]]}`, 200, ""},
		{"string list", "/v1/completions", `{"model":"m","prompt":["a","b"]}`, 200, ""},
		{"duplicate model", "/v1/completions", `{"model":"a","model":"m","prompt":"x"}`, 400, ""},
		{"duplicate model escaped", "/v1/completions", `{"model":"m","\u006dodel":"b","prompt":"x"}`, 400, ""},
		{"duplicate nested key", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"a","content":"b"}]}`, 400, ""},
		{"case-folded router key", "/v1/completions", `{"model":"m","Model":"x","prompt":"x"}`, 400, ""},
		{"invalid UTF-8 in prompt", "/v1/completions", "{\"model\":\"m\",\"prompt\":\"a\xff\xfeb\"}", 400, ""},
		{"invalid UTF-8 in message", "/v1/chat/completions", "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"\xc3\"}]}", 400, ""},
		{"text/plain", "/v1/completions", `{"model":"m","prompt":"x"}`, 400, ""},
		{"form (curl -d)", "/v1/completions", `{"model":"m","prompt":"x"}`, 400, ""},
		{"route text/plain", "/v1/route", `{"model":"m","prompt":"x"}`, 400, ""},
		{"json with charset", "/v1/completions", `{"model":"m","prompt":"x"}`, 200, ""},
		{"vendor +json", "/v1/completions", `{"model":"m","prompt":"x"}`, 200, ""},
		{"no content type", "/v1/completions", `{"model":"m","prompt":"x"}`, 200, ""},
	}
	// Content-Type other than application/json, by test name ("-": none).
	cts := map[string]string{
		"text/plain":        "text/plain",
		"form (curl -d)":    "application/x-www-form-urlencoded",
		"route text/plain":  "text/plain; charset=utf-8",
		"json with charset": "application/json; charset=utf-8",
		"vendor +json":      "application/vnd.api+json",
		"no content type":   "-",
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var hdr []string
			switch ct := cts[tt.name]; ct {
			case "":
			case "-":
				hdr = []string{"Content-Type", ""}
			default:
				hdr = []string{"Content-Type", ct}
			}
			resp := rg.post(tt.path, tt.body, hdr...)
			body := readAll(t, resp)
			if resp.StatusCode != tt.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tt.status, body)
			}
			if tt.status == 200 {
				return
			}
			var e struct {
				Error struct {
					Message string  `json:"message"`
					Type    string  `json:"type"`
					Param   *string `json:"param"`
					Code    int     `json:"code"`
				} `json:"error"`
			}
			if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error.Message == "" || e.Error.Type == "" || e.Error.Code != tt.status {
				t.Fatalf("not OpenAI's error shape: %s (%v)", body, err)
			}
			if want := map[int]string{400: typeInvalidRequest, 404: typeNotFound}[tt.status]; e.Error.Type != want {
				t.Errorf("type %q, want %q", e.Error.Type, want)
			}
			if got := ""; e.Error.Param != nil {
				got = *e.Error.Param
				if got != tt.param {
					t.Errorf("param %q, want %q", got, tt.param)
				}
			} else if tt.param != "" {
				t.Errorf("param null, want %q", tt.param)
			}
			if resp.Header.Get("Content-Type") != "application/json" {
				t.Errorf("content-type %q", resp.Header.Get("Content-Type"))
			}
		})
	}
	if n := rg.engines[0].requests.Load(); n != 6 {
		t.Errorf("engine got %d requests, want only the 6 valid ones", n)
	}
}
