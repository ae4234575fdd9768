package proxy

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
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
		if chat && len(r.messages) == 0 {
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
		if r2.model != r.model || r2.stream != r.stream || r2.promptText != r.promptText || len(r2.messages) != len(r.messages) ||
			len(r2.promptTokens) != len(r.promptTokens) {
			t.Fatalf("forwarded body changed the request:\n%s\n%s", body, fwd)
		}
		if same, _ := r.forwardBody(false); !bytes.Equal(same, body) {
			t.Fatal("disabled hit report changed the body")
		}
	})
}
