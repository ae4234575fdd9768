package proxy

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"kvrouter/internal/config"
	"kvrouter/internal/fleet"
)

func intp(n int) *int { return &n }

func TestAliasRewrite(t *testing.T) {
	fast := config.Alias{Name: "fast", ChatTemplateKwargs: map[string]any{"enable_thinking": false},
		ThinkingTokenBudget: intp(64), MaxTokens: 100, MaxTokensCap: 500}
	tests := []struct {
		name string
		a    config.Alias
		chat bool
		in   string
		want map[string]string // field -> JSON
	}{
		{"defaults set", fast, true, `{"model":"fast","messages":[]}`,
			map[string]string{"model": `"base"`, "chat_template_kwargs": `{"enable_thinking":false}`, "thinking_token_budget": "64", "max_tokens": "100"}},
		{"client kwargs kept, alias's win; caps", fast, true,
			`{"model":"fast","messages":[],"chat_template_kwargs":{"enable_thinking":true,"x":1},"thinking_token_budget":1000,"max_completion_tokens":9000}`,
			map[string]string{"chat_template_kwargs": `{"enable_thinking":false,"x":1}`, "thinking_token_budget": "64", "max_completion_tokens": "500", "max_tokens": ""}},
		{"under the caps unchanged", fast, true, `{"model":"fast","messages":[],"thinking_token_budget":10,"max_tokens":20}`,
			map[string]string{"thinking_token_budget": "10", "max_tokens": "20"}},
		{"cap alone sets max_tokens", config.Alias{MaxTokensCap: 300}, false, `{"model":"x","prompt":"p"}`,
			map[string]string{"max_tokens": "300", "chat_template_kwargs": ""}},
		{"completion: no template kwargs", fast, false, `{"model":"x","prompt":"p","max_completion_tokens":9000}`,
			map[string]string{"chat_template_kwargs": "", "max_tokens": "100", "max_completion_tokens": "9000"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := rewriteAlias(&tt.a, []byte(tt.in), "base", tt.chat)
			if err != nil {
				t.Fatal(err)
			}
			var got map[string]json.RawMessage
			if err := json.Unmarshal(out, &got); err != nil {
				t.Fatal(err)
			}
			for k, want := range tt.want {
				if string(got[k]) != want {
					t.Errorf("%s = %s, want %q (body %s)", k, got[k], want, out)
				}
			}
		})
	}
	if _, err := rewriteAlias(&fast, []byte(`{"model":"fast","messages":[],"max_tokens":"many"}`), "b", true); err == nil {
		t.Error("max_tokens a string: want an error")
	}
}

// reasoningEngine answers like vLLM with a reasoning parser: the message's
// reasoning_content beside content, usage with reasoning tokens.
func reasoningEngine(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/v1/chat/completions" {
		http.NotFound(w, r)
		return
	}
	body, _ := io.ReadAll(r.Body)
	var req struct {
		Stream bool `json:"stream"`
	}
	_ = json.Unmarshal(body, &req)
	usage := `"usage":{"prompt_tokens":40,"completion_tokens":12,"total_tokens":52,"prompt_tokens_details":{"cached_tokens":32},"completion_tokens_details":{"reasoning_tokens":9}}`
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"c","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","reasoning_content":"secret plan","content":"hi"},"finish_reason":"stop"}],%s}`, usage)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	for _, d := range []string{
		`{"id":"c","choices":[{"index":0,"delta":{"reasoning":"secret step"},"finish_reason":null}]}`,
		`{"id":"c","choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":"stop"}]}`,
		`{"id":"c","choices":[],` + usage + `}`,
		"[DONE]",
	} {
		fmt.Fprintf(w, "data: %s\n\n", d)
	}
}

// TestAliasStripsReasoning: a route with strip_reasoning answers without
// the engine's reasoning (streaming and not), its defaults reach the
// engine under the group's model name, and its series count the usage.
func TestAliasStripsReasoning(t *testing.T) {
	rg := newRig(t, 1, func(c *config.Config, _ *fleet.Config) {
		c.Models[0].Aliases = []config.Alias{{Name: "m-fast", StripReasoning: true, MaxTokens: 7,
			ChatTemplateKwargs: map[string]any{"enable_thinking": false}}, {Name: "m-think"}}
	})
	rg.engines[0].srv.Config.Handler = http.HandlerFunc(reasoningEngine)
	for _, stream := range []bool{false, true} {
		body := fmt.Sprintf(`{"model":"m-fast","stream":%v,"messages":[{"role":"user","content":"hi"}]}`, stream)
		out := readAll(t, rg.post("/v1/chat/completions", body))
		if strings.Contains(out, "secret") || strings.Contains(out, `"reasoning":`) || strings.Contains(out, `"reasoning_content"`) || !strings.Contains(out, `"hi"`) {
			t.Errorf("stream %v: %s", stream, out)
		}
		if stream && !strings.HasSuffix(out, "data: [DONE]\n\n") {
			t.Errorf("stream lost its end: %q", out)
		}
	}
	if out := readAll(t, rg.post("/v1/chat/completions", `{"model":"m-think","messages":[{"role":"user","content":"hi"}]}`)); !strings.Contains(out, "secret plan") {
		t.Errorf("route without strip_reasoning: %s", out)
	}
	for k, want := range map[string]float64{"prompt": 80, "cached": 64, "reasoning": 18} {
		if got := testutil.ToFloat64(rg.srv.fm.routeTokens.WithLabelValues("m-fast", k)); got != want {
			t.Errorf("route tokens %s = %v, want %v", k, got, want)
		}
	}
	if got := testutil.ToFloat64(rg.srv.fm.routeRequests.WithLabelValues("m-fast", outcomeOK)); got != 2 {
		t.Errorf("route requests = %v, want 2", got)
	}
	if got := testutil.ToFloat64(rg.srv.m.requests.WithLabelValues("m", "e0", outcomeOK)); got != 3 {
		t.Errorf("group requests = %v, want 3 (aliases count under their group)", got)
	}
}
