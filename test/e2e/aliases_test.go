package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestE2ERouteAliasesThinking: two route aliases over one group, thinking
// off (with a max_tokens default) and on, against an engine-sim with the
// Qwen3 tokenizer and chat template. For each: the router's prompt tokens
// are the engine's (usage.prompt_tokens, and the engine's /tokenize with
// the same chat_template_kwargs), the two renders differ, and a repeat's
// predicted cached tokens equal the engine's (prediction off: the index
// holds only what the engine's events report, so equal keys mean equal
// tokens).
func TestE2ERouteAliasesThinking(t *testing.T) {
	e2eLeakCheck(t)
	bin := e2eBuild(t)
	sim := startE2ESimProcessArgs(t, bin, 1, "--tokenizer", e2eQwen3Dir)
	yaml := fmt.Sprintf(`health: {probe_interval: 200ms, scrape_interval: 200ms}
models:
  - name: m
    tokenizer: %s
    index: {predict_ttl: -1s}
    aliases:
      - {name: m-fast, chat_template_kwargs: {enable_thinking: false}, max_tokens: 3}
      - {name: m-think, chat_template_kwargs: {enable_thinking: true}}
    engines:
      - {name: e0, url: %q, events: %q, replay: %q}
`, e2eQwen3Dir, sim.url, sim.events, sim.replay)
	r := serveYAML(t, yaml, 0)
	t.Cleanup(sim.stop)
	r.waitFullyReady(t)
	messages := []map[string]string{
		{"role": "system", "content": strings.Repeat("You answer questions about shipping schedules precisely. ", 20)},
		{"role": "user", "content": "When does the Lyon parcel leave?"},
	}
	prompts := map[string]int{}
	for _, tc := range []struct {
		alias    string
		thinking bool
	}{{"m-fast", false}, {"m-think", true}} {
		body, _ := json.Marshal(map[string]any{"model": tc.alias, "messages": messages, "max_tokens": nil})
		if tc.alias == "m-think" {
			body, _ = json.Marshal(map[string]any{"model": tc.alias, "messages": messages, "max_tokens": 2})
		}
		var usage struct {
			Usage struct {
				Prompt     int `json:"prompt_tokens"`
				Completion int `json:"completion_tokens"`
			} `json:"usage"`
		}
		resp, out := r.post("/v1/chat/completions", string(body))
		if resp.StatusCode != 200 || json.Unmarshal([]byte(out), &usage) != nil {
			t.Fatalf("%s: %d %s", tc.alias, resp.StatusCode, out)
		}
		p := usage.Usage.Prompt
		prompts[tc.alias] = p
		if tc.alias == "m-fast" && usage.Usage.Completion != 3 {
			t.Errorf("m-fast: %d completion tokens, want the alias's max_tokens 3", usage.Usage.Completion)
		}
		// The engine's own render with the same kwargs.
		tb, _ := json.Marshal(map[string]any{"model": "m", "messages": messages,
			"chat_template_kwargs": map[string]any{"enable_thinking": tc.thinking}})
		tr, err := http.Post(sim.url+"/tokenize", "application/json", strings.NewReader(string(tb)))
		if err != nil {
			t.Fatal(err)
		}
		var tok struct {
			Count int `json:"count"`
		}
		_ = json.NewDecoder(tr.Body).Decode(&tok)
		tr.Body.Close()
		if tok.Count != p {
			t.Errorf("%s: engine /tokenize %d tokens, usage %d", tc.alias, tok.Count, p)
		}
		want := (p - 1) / 16 * 16
		e2eEventually(t, 10*time.Second, tc.alias+" blocks indexed", func() bool {
			resp, out := r.post("/v1/route", string(body))
			var d struct {
				Prompt int `json:"prompt_tokens"`
			}
			_ = json.Unmarshal([]byte(out), &d)
			if d.Prompt != p {
				t.Fatalf("%s: router has %d prompt tokens, the engine %d", tc.alias, d.Prompt, p)
			}
			return resp.Header.Get("X-Kvrouter-Cached-Tokens") == strconv.Itoa(want)
		})
		resp, out = r.post("/v1/chat/completions", string(body))
		if got := e2eCachedTokens(t, out); resp.StatusCode != 200 || resp.Header.Get("X-Kvrouter-Cached-Tokens") != strconv.Itoa(want) || got != want {
			t.Fatalf("%s repeat: predicted %s, engine %d, want %d", tc.alias, resp.Header.Get("X-Kvrouter-Cached-Tokens"), got, want)
		}
	}
	if prompts["m-fast"] == prompts["m-think"] {
		t.Errorf("thinking off and on rendered the same %d tokens", prompts["m-fast"])
	}
	if n := e2eMetric(t, r.url, "kvrouter_proxy_route_requests_total", `route="m-fast"`, `outcome="ok"`); n != 2 {
		t.Errorf("m-fast requests = %v, want 2", n)
	}
}
