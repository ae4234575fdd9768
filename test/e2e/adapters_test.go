package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

func e2eCompletionFor(model string, ids []int) string {
	b, _ := json.Marshal(map[string]any{"model": model, "prompt": ids, "max_tokens": 2})
	return string(b)
}

// TestE2EAdapters: two engine-sim processes, e0 serving the adapter sql
// (--lora-modules), e1 none. Requests for sql reach only e0; a prompt the
// base model cached on e0 is not a hit for sql with the same tokens
// (predicted 0, engine 0), its repeat is (predicted = engine = 192); an
// adapter no engine has is loaded by kvrouter on one engine, once, and then
// served there; an unknown adapter is a 404.
func TestE2EAdapters(t *testing.T) {
	e2eLeakCheck(t)
	bin := e2eBuild(t)
	a := startE2ESimProcessArgs(t, bin, 1, "--lora-modules", "sql=/adapters/sql", "--lora-load-delay", "100ms")
	b := startE2ESimProcessArgs(t, bin, 1, "--lora-load-delay", "100ms")
	yaml := fmt.Sprintf(`health: {probe_interval: 200ms, scrape_interval: 200ms, models_interval: 200ms}
models:
  - name: m
    tokenizer: none
    adapters:
      - {name: math, path: /adapters/math}
    adapter_loading: load
    engines:
      - {name: e0, url: %q, events: %q, replay: %q}
      - {name: e1, url: %q, events: %q, replay: %q}
`, a.url, a.events, a.replay, b.url, b.events, b.replay)
	r := serveYAML(t, yaml, 0)
	t.Cleanup(a.stop)
	t.Cleanup(b.stop)
	r.waitFullyReady(t)
	// sql is learned from e0's listing (parent m): wait until it is routed.
	e2eEventually(t, 10*time.Second, "sql learned from /v1/models", func() bool {
		resp, _ := r.post("/v1/completions", e2eCompletionFor("sql", []int{1, 2, 3}))
		return resp.StatusCode == 200
	})

	prompt := make([]int, 200)
	for i := range prompt {
		prompt[i] = 3000 + i
	}
	// The base model caches the prompt on e0.
	resp, err := http.Post(a.url+"/v1/completions", "application/json", strings.NewReader(e2eCompletionFor("m", prompt)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	e2eEventually(t, 10*time.Second, "e0's base blocks indexed", func() bool {
		resp, _ := r.post("/v1/route", e2eCompletionFor("m", prompt))
		return resp.Header.Get("X-Kvrouter-Cached-Tokens") == "192"
	})
	for i, want := range []int{0, 192} {
		resp, out := r.post("/v1/completions", e2eCompletionFor("sql", prompt))
		if resp.StatusCode != 200 || resp.Header.Get("X-Kvrouter-Replica") != "e0" {
			t.Fatalf("sql request %d: %d on %q: %s", i, resp.StatusCode, resp.Header.Get("X-Kvrouter-Replica"), out)
		}
		if p, got := resp.Header.Get("X-Kvrouter-Cached-Tokens"), e2eCachedTokens(t, out); p != fmt.Sprint(want) || got != want {
			t.Fatalf("sql request %d: predicted %s, engine %d, want %d both", i, p, got, want)
		}
	}
	// Many sql requests, other prompts: never on e1.
	for i := range 20 {
		ids := []int{9000 + i, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17}
		resp, out := r.post("/v1/completions", e2eCompletionFor("sql", ids))
		if resp.StatusCode != 200 || resp.Header.Get("X-Kvrouter-Replica") != "e0" {
			t.Fatalf("sql request %d: %d on %q: %s", i, resp.StatusCode, resp.Header.Get("X-Kvrouter-Replica"), out)
		}
	}

	// math: on no engine, loaded at run time on one, then served there.
	var on string
	for i := range 5 {
		resp, out := r.post("/v1/completions", e2eCompletionFor("math", prompt))
		if resp.StatusCode != 200 {
			t.Fatalf("math request %d: %d %s", i, resp.StatusCode, out)
		}
		rep := resp.Header.Get("X-Kvrouter-Replica")
		if on == "" {
			on = rep
		} else if rep != on {
			t.Fatalf("math request %d on %s, loaded on %s", i, rep, on)
		}
	}
	if n := e2eMetric(t, r.url, "kvrouter_proxy_adapter_loads_total", `result="ok"`); n != 1 {
		t.Errorf("adapter loads = %v, want 1", n)
	}
	if resp, out := r.post("/v1/completions", e2eCompletionFor("nope", prompt)); resp.StatusCode != 404 || !strings.Contains(out, "not_found_error") {
		t.Errorf("unknown adapter: %d %s", resp.StatusCode, out)
	}
}
