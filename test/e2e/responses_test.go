package e2e

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
)

// e2eResponse reads a Responses answer's id and usage.
type e2eResponse struct {
	ID    string `json:"id"`
	Usage struct {
		Input   int `json:"input_tokens"`
		Details struct {
			Cached int `json:"cached_tokens"`
		} `json:"input_tokens_details"`
	} `json:"usage"`
}

// TestE2EResponses: /v1/responses through kvrouter to two engine-sims with
// the Qwen3 tokenizer and template and the responses store on
// (VLLM_ENABLE_RESPONSES_API_STORE=1). The router renders instructions and
// input as the engine does (its prompt tokens are the engine's
// input_tokens); a repeat lands on the engine holding the prompt with the
// predicted cached tokens equal to the engine's; continuations by
// previous_response_id reach the engine that stored each response (the
// other answers 404); a stream ends with response.completed, whole; bad
// input is an OpenAI-shaped 400.
func TestE2EResponses(t *testing.T) {
	e2eLeakCheck(t)
	bin := e2eBuild(t)
	var sims []*e2eSim
	engines := ""
	for i := range 2 {
		ev, rep := e2eFreePort(t), e2eFreePort(t)
		s := startSimProc(t, bin, simProcOpts{events: ev, replay: rep, health: true, env: []string{"VLLM_ENABLE_RESPONSES_API_STORE=1"}},
			"--served-model-name", "m", "--profile", "fast", "--max-model-len", "32768", "--num-gpu-blocks-override", "16384",
			"--kv-events-config", kvEventsConfig("*", ev, rep, ""), "--tokenizer", e2eQwen3Dir)
		sims = append(sims, s)
		engines += fmt.Sprintf("      - {name: e%d, url: %q, events: %q, replay: %q}\n", i, s.url, s.events, s.replay)
	}
	yaml := fmt.Sprintf(`health: {probe_interval: 200ms, scrape_interval: 200ms}
models:
  - name: m
    tokenizer: %s
    index: {predict_ttl: -1s}
    engines:
%s`, e2eQwen3Dir, engines)
	r := serveYAML(t, yaml, 0)
	for _, s := range sims {
		t.Cleanup(s.stop)
	}
	r.waitFullyReady(t)
	instructions := strings.Repeat("You answer questions about shipping schedules precisely. ", 20)
	body := func(input any, extra ...any) string {
		m := map[string]any{"model": "m", "instructions": instructions, "input": input, "max_output_tokens": 4}
		for i := 0; i+1 < len(extra); i += 2 {
			m[extra[i].(string)] = extra[i+1]
		}
		b, _ := json.Marshal(m)
		return string(b)
	}
	decode := func(what, out string) e2eResponse {
		t.Helper()
		var a e2eResponse
		if err := json.Unmarshal([]byte(out), &a); err != nil {
			t.Fatalf("%s: %v: %s", what, err, out)
		}
		return a
	}
	items := []any{map[string]any{"type": "message", "role": "user", "content": []any{map[string]any{"type": "input_text", "text": "When does the Lyon parcel leave?"}}}}
	first := body(items)
	resp, out := r.post("/v1/responses", first)
	if resp.StatusCode != 200 {
		t.Fatalf("first: %d %s", resp.StatusCode, out)
	}
	a := decode("first", out)
	holder := resp.Header.Get("X-Kvrouter-Replica")
	want := (a.Usage.Input - 1) / 16 * 16
	e2eEventually(t, 10*time.Second, "the prompt's blocks indexed", func() bool {
		resp, out := r.post("/v1/responses", first, "X-Kvrouter-Route-Only", "1")
		var d struct {
			Prompt    int  `json:"prompt_tokens"`
			Tokenized bool `json:"tokenized"`
		}
		_ = json.Unmarshal([]byte(out), &d)
		if !d.Tokenized || d.Prompt != a.Usage.Input {
			t.Fatalf("router: %d prompt tokens (tokenized %v), the engine %d: %s", d.Prompt, d.Tokenized, a.Usage.Input, out)
		}
		return resp.Header.Get("X-Kvrouter-Cached-Tokens") == strconv.Itoa(want)
	})
	resp, out = r.post("/v1/responses", first)
	if b := decode("repeat", out); resp.StatusCode != 200 || resp.Header.Get("X-Kvrouter-Replica") != holder ||
		resp.Header.Get("X-Kvrouter-Cached-Tokens") != strconv.Itoa(want) || b.Usage.Details.Cached != want || want == 0 {
		t.Fatalf("repeat: on %s (holder %s), predicted %s, engine %d, want %d", resp.Header.Get("X-Kvrouter-Replica"), holder,
			resp.Header.Get("X-Kvrouter-Cached-Tokens"), b.Usage.Details.Cached, want)
	}

	// Conversations on both engines, each continued where it is stored.
	held := map[string]string{}
	for i := range 6 {
		resp, out := r.post("/v1/responses", body(fmt.Sprintf("Question %d: which dock?", i), "instructions", fmt.Sprintf("Conversation %d. %s", i, instructions)))
		if resp.StatusCode != 200 {
			t.Fatalf("conversation %d: %d %s", i, resp.StatusCode, out)
		}
		held[decode("conversation", out).ID] = resp.Header.Get("X-Kvrouter-Replica")
	}
	seen := map[string]bool{}
	for id, eng := range held {
		seen[eng] = true
		resp, out := r.post("/v1/responses", body("And after that?", "previous_response_id", id))
		if resp.StatusCode != 200 || resp.Header.Get("X-Kvrouter-Replica") != eng {
			t.Fatalf("continuation of %s (stored on %s): %d on %s %s", id, eng, resp.StatusCode, resp.Header.Get("X-Kvrouter-Replica"), out)
		}
	}
	if len(seen) != 2 {
		t.Logf("every conversation was stored on %v (load did not spread them)", seen)
	}
	for id, eng := range held { // the other engine does not have it
		other := sims[0]
		if eng == "e0" {
			other = sims[1]
		}
		resp, err := r.client.Post(other.url+"/v1/responses", "application/json", strings.NewReader(body("x", "previous_response_id", id)))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 404 {
			t.Fatalf("%s on the engine not holding it: %d, want 404", id, resp.StatusCode)
		}
		break
	}

	resp, out = r.post("/v1/responses", body(items, "stream", true))
	if resp.StatusCode != 200 || !strings.HasPrefix(out, "event: response.created\n") || !strings.Contains(out, "event: response.completed\n") ||
		strings.Contains(out, `"error"`) {
		t.Fatalf("stream: %d %s", resp.StatusCode, out)
	}
	if n := e2eMetric(t, r.url, "kvrouter_proxy_requests_total", `outcome="upstream_error"`); n != 0 {
		t.Errorf("%v upstream errors", n)
	}

	resp, out = r.post("/v1/responses", `{"model":"m","input":5}`)
	if resp.StatusCode != 400 || !strings.Contains(out, `"type":"invalid_request_error"`) || !strings.Contains(out, `"param":"input"`) {
		t.Fatalf("bad input: %d %s", resp.StatusCode, out)
	}
}
