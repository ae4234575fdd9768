package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// e2eFreePorts returns a loopback base port p with p..p+n-1 free a moment
// ago (a data-parallel engine publishes rank r on port+r).
func e2eFreePorts(t *testing.T, n int) int {
	t.Helper()
	for range 100 {
		p := e2eFreePort(t)
		ok := true
		for i := 1; i < n && ok; i++ {
			ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p+i))
			if err != nil {
				ok = false
				continue
			}
			ln.Close()
		}
		if ok {
			return p
		}
	}
	t.Fatalf("no %d consecutive free ports", n)
	return 0
}

// startE2ESimProcessArgs is startE2ESimProcess with dpSize ranks (event and
// replay ports apart by dpSize) and extra engine-sim flags; runtime LoRA
// loading is allowed.
func startE2ESimProcessArgs(t *testing.T, bin string, dpSize int, extra ...string) *e2eSim {
	t.Helper()
	ev, rep := e2eFreePorts(t, dpSize), e2eFreePorts(t, dpSize)
	return startSimProc(t, bin, simProcOpts{events: ev, replay: rep, health: true, env: []string{"VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"}},
		append([]string{"--served-model-name", "m", "--profile", "fast", "--max-model-len", "32768",
			"--num-gpu-blocks-override", "16384", "--kv-events-config", kvEventsConfig("*", ev, rep, ""),
			"--data-parallel-size", strconv.Itoa(dpSize)}, extra...)...)
}

// e2eCompletion is a token-id completion body.
func e2eCompletion(ids []int) string {
	b, _ := json.Marshal(map[string]any{"model": "m", "prompt": ids, "max_tokens": 2})
	return string(b)
}

// e2eCachedTokens reads usage.prompt_tokens_details.cached_tokens.
func e2eCachedTokens(t *testing.T, body string) int {
	t.Helper()
	var out struct {
		Usage struct {
			Details struct {
				Cached int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if err := json.Unmarshal([]byte(body), &out); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	return out.Usage.Details.Cached
}

// TestE2EDataParallelRanks: one engine-sim process with two data-parallel
// ranks behind one endpoint, each with its own cache and event stream. A
// prompt cached on rank 1 (sent there directly) is predicted by kvrouter
// and the request lands on rank 1 (X-data-parallel-rank): the engine
// reports exactly the predicted cached tokens. (Before rank routing the
// router predicted 192 and the engine's own balancer sent the request to
// the idle rank 0, which had 0.) A repeat of a prompt routed by kvrouter
// lands on its rank too.
func TestE2EDataParallelRanks(t *testing.T) {
	e2eLeakCheck(t)
	bin := e2eBuild(t)
	sim := startE2ESimProcessArgs(t, bin, 2)
	yaml := fmt.Sprintf(`health: {probe_interval: 200ms, scrape_interval: 200ms}
models:
  - name: m
    tokenizer: none
    engines:
      - {name: e0, url: %q, events: %q, replay: %q, dp_size: 2}
`, sim.url, sim.events, sim.replay)
	r := serveYAML(t, yaml, 0)
	t.Cleanup(sim.stop)
	r.waitFullyReady(t)

	prompt := make([]int, 200) // 12 whole blocks of 16 reusable: 192 tokens
	for i := range prompt {
		prompt[i] = 1000 + i
	}
	body := e2eCompletion(prompt)
	req, _ := http.NewRequest(http.MethodPost, sim.url+"/v1/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-data-parallel-rank", "1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("direct to rank 1: %d", resp.StatusCode)
	}
	e2eEventually(t, 10*time.Second, "rank 1's blocks indexed", func() bool {
		resp, _ := r.post("/v1/route", body)
		return resp.Header.Get("X-Kvrouter-Cached-Tokens") == "192"
	})
	resp, out := r.post("/v1/completions", body)
	if resp.StatusCode != 200 {
		t.Fatalf("via kvrouter: %d %s", resp.StatusCode, out)
	}
	if p, got := resp.Header.Get("X-Kvrouter-Cached-Tokens"), e2eCachedTokens(t, out); p != "192" || got != 192 {
		t.Fatalf("predicted %s cached tokens, engine reported %d (want 192 both)", p, got)
	}

	// A prompt kvrouter routes first, then its repeat.
	other := make([]int, 300)
	for i := range other {
		other[i] = 5000 + i
	}
	body = e2eCompletion(other)
	if resp, out := r.post("/v1/completions", body); resp.StatusCode != 200 || e2eCachedTokens(t, out) != 0 {
		t.Fatalf("first of a new prompt: %d %s", resp.StatusCode, out)
	}
	e2eEventually(t, 10*time.Second, "the new prompt's blocks confirmed", func() bool {
		return e2eMetric(t, r.url, "kvrouter_kvindex_entries") >= 12+18
	})
	resp, out = r.post("/v1/completions", body)
	if p, got := resp.Header.Get("X-Kvrouter-Cached-Tokens"), e2eCachedTokens(t, out); resp.StatusCode != 200 || p != "288" || got != 288 {
		t.Fatalf("repeat: status %d, predicted %s, engine %d (want 288 both)", resp.StatusCode, p, got)
	}
}
