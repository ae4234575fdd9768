package proxy

import (
	"encoding/json"
	"strings"
	"testing"
)

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
		{"gzip body", "/v1/chat/completions", "\x1f\x8b\x08\x00\x00\x00\x00\x00", 400, ""},
		{"identity encoding", "/v1/completions", `{"model":"m","prompt":"x"}`, 200, ""},
		{"byte order mark", "/v1/chat/completions", "\xef\xbb\xbf" + `{"model":"m","messages":[{"role":"user","content":"x"}]}`, 200, ""},
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
	// Content-Encoding, by test name, and what the error must then say.
	encs := map[string]string{"gzip body": "gzip", "identity encoding": "identity"}
	says := map[string]string{"gzip body": `Content-Encoding "gzip"`}
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
			if ce := encs[tt.name]; ce != "" {
				hdr = append(hdr, "Content-Encoding", ce)
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
			if !strings.Contains(e.Error.Message, says[tt.name]) {
				t.Errorf("message %q does not say %q", e.Error.Message, says[tt.name])
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
	if n := rg.engines[0].requests.Load(); n != 8 {
		t.Errorf("engine got %d requests, want only the 8 valid ones", n)
	}
}
