package e2e

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// startPDSimProcess runs "kvrouter engine-sim" as a process with the Qwen3
// tokenizer, KV events and NixlConnector's role (kv_producer or
// kv_consumer), plus extra flags (faults).
func startPDSimProcess(t *testing.T, bin, kvRole string, extra ...string) *e2eSim {
	t.Helper()
	ev, rep := e2eFreePort(t), e2eFreePort(t)
	return startSimProc(t, bin, simProcOpts{events: ev, replay: rep, health: true}, append([]string{
		"--served-model-name", "m", "--profile", "h100-llama3-8b", "--tokenizer", e2eQwen3Dir,
		"--max-model-len", "32768", "--num-gpu-blocks-override", "16384", "--kv-events-config", kvEventsConfig("*", ev, rep, ""),
		"--kv-transfer-config", fmt.Sprintf(`{"kv_connector":"NixlConnector","kv_role":%q}`, kvRole), "--kv-link", "nvlink"}, extra...)...)
}

// pdEngine is one engine of a P/D router.yaml.
type pdEngine struct {
	name, role string
	sim        *e2eSim
}

// startPDRouter serves a P/D model group over engines and waits until all
// are ready (events connected).
func startPDRouter(t *testing.T, engines ...pdEngine) *e2eRouter {
	t.Helper()
	var b strings.Builder
	b.WriteString("health: {probe_interval: 200ms, scrape_interval: 200ms, backoff_base: 30s, backoff_max: 60s}\nmodels:\n  - name: m\n")
	b.WriteString("    tokenizer: " + e2eQwen3Dir + "\n    routing: {prefill_rate: 20000}\n    timeouts: {first_byte: 5s}\n    pd: {link: nvlink}\n    engines:\n")
	for _, e := range engines {
		fmt.Fprintf(&b, "      - {name: %s, role: %s, url: %q, events: %q, replay: %q}\n", e.name, e.role, e.sim.url, e.sim.events, e.sim.replay)
	}
	r := serveYAML(t, b.String(), slog.LevelWarn)
	t.Cleanup(func() {
		for _, e := range engines {
			e.sim.stop() // while the router is still subscribed (see startE2ERouterWait)
		}
	})
	r.waitFullyReady(t)
	return r
}

func pdChat(content string, stream bool) string {
	b, _ := json.Marshal(map[string]any{"model": "m", "max_tokens": 8, "stream": stream,
		"messages": []map[string]string{{"role": "user", "content": content}}})
	return string(b)
}

func e2eCompletionText(prompt string, maxTokens int, stream bool) string {
	b, _ := json.Marshal(map[string]any{"model": "m", "prompt": prompt, "max_tokens": maxTokens, "stream": stream})
	return string(b)
}

// TestE2EPD runs the two-leg exchange through kvrouter serve against
// engine-sim processes (NixlConnector roles, KV events, the Qwen3
// tokenizer on both sides): chat and completions, streamed and not; a
// short prompt prefilled by the decode engine; a repeated long prompt's
// prefill leg on the prefill engine whose KV events say it holds the
// prompt; a failing prefill engine answered within 1 s with no decode leg;
// a decode engine dying mid-stream.
func TestE2EPD(t *testing.T) {
	e2eLeakCheck(t)
	bin := e2eBuild(t)
	p0, p1 := startPDSimProcess(t, bin, "kv_producer"), startPDSimProcess(t, bin, "kv_producer")
	d0, d1 := startPDSimProcess(t, bin, "kv_consumer"), startPDSimProcess(t, bin, "kv_consumer")
	r := startPDRouter(t, pdEngine{"p0", "prefill", p0}, pdEngine{"p1", "prefill", p1}, pdEngine{"d0", "decode", d0}, pdEngine{"d1", "decode", d1})
	long := func(tag string) string {
		return strings.Repeat(fmt.Sprintf("Ledger %s entry: pallets moved between depots, counted twice. ", tag), 150) // ~2,500 tokens
	}

	t.Run("two legs", func(t *testing.T) {
		for _, tc := range []struct {
			path, body string
			stream     bool
		}{
			{"/v1/completions", e2eCompletionText(long("a"), 8, false), false},
			{"/v1/completions", e2eCompletionText(long("b"), 8, true), true},
			{"/v1/chat/completions", pdChat(long("c"), false), false},
			{"/v1/chat/completions", pdChat(long("d"), true), true},
		} {
			resp, body := r.post(tc.path, tc.body)
			if resp.StatusCode != 200 || resp.Header.Get("X-Kvrouter-Path") != "disaggregated" ||
				!strings.HasPrefix(resp.Header.Get("X-Kvrouter-Prefill-Replica"), "p") || !strings.HasPrefix(resp.Header.Get("X-Kvrouter-Replica"), "d") {
				t.Fatalf("%s: %d %v %s", tc.path, resp.StatusCode, resp.Header, body)
			}
			if tc.stream != strings.Contains(body, "data: [DONE]") || !strings.Contains(body, `"completion_tokens":8`) && !tc.stream {
				t.Fatalf("%s: body %s", tc.path, body)
			}
		}
		// The decode engines pulled KV instead of computing it.
		var pulls float64
		for _, d := range []*e2eSim{d0, d1} {
			pulls += e2eMetric(t, d.url, "vllm:nixl_xfer_time_seconds_count")
		}
		if pulls != 4 {
			t.Fatalf("decode engines made %v KV pulls, want 4", pulls)
		}
	})

	t.Run("short prompt bypass", func(t *testing.T) {
		resp, body := r.post("/v1/completions", e2eCompletionText("What is two plus two?", 4, true))
		if resp.StatusCode != 200 || resp.Header.Get("X-Kvrouter-Path") != "local" || !strings.HasPrefix(resp.Header.Get("X-Kvrouter-Replica"), "d") ||
			resp.Header.Get("X-Kvrouter-Prefill-Replica") != "" || !strings.Contains(body, "[DONE]") {
			t.Fatalf("%d %v %s", resp.StatusCode, resp.Header, body)
		}
		if n := e2eMetric(t, r.url, "kvrouter_proxy_pd_requests_total", `path="local"`, `reason="short_prompt"`); n != 1 {
			t.Fatalf("local path counted %v times", n)
		}
	})

	t.Run("prefill on holder", func(t *testing.T) {
		// A shared document with a new question each time: the document is
		// cached on the prefill engine that computed it (and, after the
		// pull, on one decode engine), each question is over 1,000 new
		// tokens, so every request goes remote, to the document's holder.
		doc := long("holder")
		ask := func(i int) string {
			return doc + strings.Repeat(fmt.Sprintf("Question %d about crate %d, answered in full. ", i, i*7), 100)
		}
		resp, body := r.post("/v1/completions", e2eCompletionText(ask(0), 2, false))
		if resp.StatusCode != 200 || resp.Header.Get("X-Kvrouter-Path") != "disaggregated" {
			t.Fatalf("%d %v %s", resp.StatusCode, resp.Header, body)
		}
		holder := resp.Header.Get("X-Kvrouter-Prefill-Replica")
		// Once the holder's BlockStored events reach the index, the dry run
		// finds the document there.
		e2eEventually(t, 10*time.Second, "prefill engine's events indexed", func() bool {
			_, ex := r.post("/v1/route", e2eCompletionText(ask(1), 2, false))
			var out struct {
				Prefill struct {
					Replica      string `json:"replica"`
					CachedTokens int    `json:"cached_tokens"`
				} `json:"prefill"`
			}
			return json.Unmarshal([]byte(ex), &out) == nil && out.Prefill.Replica == holder && out.Prefill.CachedTokens > 1000
		})
		for i := 1; i <= 3; i++ {
			resp, body := r.post("/v1/completions", e2eCompletionText(ask(i), 2, false))
			if got := resp.Header.Get("X-Kvrouter-Prefill-Replica"); resp.StatusCode != 200 || got != holder {
				t.Fatalf("question %d: %d prefill on %q, want %s: %v %s", i, resp.StatusCode, got, holder, resp.Header, body)
			}
			if c, _ := strconv.Atoi(resp.Header.Get("X-Kvrouter-Prefill-Cached-Tokens")); c < 1000 {
				t.Fatalf("question %d: predicted %d cached tokens on the holder", i, c)
			}
		}
	})

	t.Run("prefill fails, decode dies", func(t *testing.T) {
		bad := startPDSimProcess(t, bin, "kv_producer", "--fault-error-rate", "1")
		dying := startPDSimProcess(t, bin, "kv_consumer", "--fault-die-rate", "1", "--fault-die-after-tokens", "3")
		rb := startPDRouter(t, pdEngine{"pbad", "prefill", bad}, pdEngine{"ddie", "decode", dying})
		t0 := time.Now()
		resp, body := rb.post("/v1/completions", e2eCompletionText(long("fail"), 8, true))
		took := time.Since(t0)
		if resp.StatusCode != http.StatusBadGateway || !strings.Contains(body, `"error"`) || took > time.Second {
			t.Fatalf("failed prefill: %d after %v: %s", resp.StatusCode, took, body)
		}
		if n := e2eMetric(t, dying.url, "vllm:prompt_tokens_total"); n != 0 {
			t.Fatalf("the decode engine computed %v prompt tokens after a failed prefill", n)
		}
		rc := startPDRouter(t, pdEngine{"pgood", "prefill", startPDSimProcess(t, bin, "kv_producer")}, pdEngine{"ddie2", "decode", dying})
		resp, body = rc.post("/v1/completions", e2eCompletionText(long("die"), 50, true))
		if resp.StatusCode != 200 || strings.Contains(body, "[DONE]") || !strings.Contains(body, `"error"`) {
			t.Fatalf("dying decode: %d %s", resp.StatusCode, body)
		}
	})
}
