package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestServeCommandStartupError runs the kvrouter binary's serve with
// configurations that cannot start: start-up fails naming the
// field and line, and never after opening the socket or printing
// "listening on".
func TestServeCommandStartupError(t *testing.T) {
	tests := []struct{ name, model, want string }{
		{"bad tokenizer path", "    tokenizer: /nonexistent/tok.json\n    engines: [{url: 'http://127.0.0.1:1'}]\n", "models[0].tokenizer (line 4)"},
		{"bad events endpoint", "    engines: [{url: 'http://127.0.0.1:1', events: 'udp://x'}]\n", "models[0].engines[0].events (line 4)"},
		{"absurd max_entries", "    index: {max_entries: 4000000000}\n    engines: [{url: 'http://127.0.0.1:1'}]\n", "models[0].index.max_entries (line 4)"},
		{"negative weight", "    routing: {kv: {gpu_weight: -1}}\n    engines: [{url: 'http://127.0.0.1:1'}]\n", "models[0].routing.kv.gpu_weight (line 4)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			port := e2eFreePort(t)
			cfg := filepath.Join(t.TempDir(), "router.yaml")
			os.WriteFile(cfg, []byte(fmt.Sprintf("listen: 127.0.0.1:%d\nmodels:\n  - name: m\n%s", port, tt.model)), 0o644)
			var out, errb bytes.Buffer
			code := run(context.Background(), []string{"serve", "--config", cfg, "--log-level", "error"}, stdio{out: &out, err: &errb})
			if code != 1 || !strings.Contains(errb.String(), tt.want) {
				t.Errorf("exit %d, stderr %q, want 1 and %q", code, errb.String(), tt.want)
			}
			if strings.Contains(errb.String(), "listening on") {
				t.Errorf("printed listening before failing: %q", errb.String())
			}
		})
	}
}

// TestServeRenderFailover: tokenizer "render" with two engines; the first
// dies: requests are still tokenized (by the second engine), so routing
// stays cache-aware (with both down, requests are routed by load and
// kvrouter_proxy_tokenizer_unavailable_total counts them ; that part is
// proxy's TestFailoverTokenizer).
func TestServeRenderFailover(t *testing.T) {
	e2eLeakCheck(t)
	a, b := startE2ESim(t), startE2ESim(t)
	r := startE2ERouter(t, "tokenizer: render\n", a, b)
	body := e2eChat("You are terse.", "What is the capital of France?")
	route := func() (tokenized bool, prompt int) {
		t.Helper()
		resp, out := r.post("/v1/route", body)
		if resp.StatusCode != 200 {
			t.Fatalf("/v1/route: %d %s", resp.StatusCode, out)
		}
		var d struct {
			Tokenized    bool `json:"tokenized"`
			PromptTokens int  `json:"prompt_tokens"`
		}
		if err := json.Unmarshal([]byte(out), &d); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		return d.Tokenized, d.PromptTokens
	}
	if tok, n := route(); !tok || n == 0 {
		t.Fatalf("both engines up: tokenized %v, %d prompt tokens", tok, n)
	}
	a.stop()
	// At once (a's death not yet noticed by the prober: connection error,
	// fail over) and after a is ejected (skipped).
	for range 3 {
		if tok, n := route(); !tok || n == 0 {
			t.Fatalf("first engine down: tokenized %v, %d prompt tokens", tok, n)
		}
	}
	if n := e2eMetric(t, r.url, "kvrouter_proxy_tokenizer_unavailable_total"); n != 0 {
		t.Errorf("tokenizer unavailable counted %v times with one engine up", n)
	}
	// The chosen engine is the live one.
	resp, out := r.post("/v1/chat/completions", body)
	if resp.StatusCode != 200 || resp.Header.Get("X-Kvrouter-Replica") != "e1" {
		t.Errorf("chat: %d via %q: %s", resp.StatusCode, resp.Header.Get("X-Kvrouter-Replica"), out)
	}
	if n := e2eMetric(t, r.url, "kvrouter_proxy_prompt_tokens_count"); n < 1 {
		t.Errorf("the forwarded request was not tokenized (prompt_tokens count %v)", n)
	}
}

// TestServeEventsBind: with events_bind the router binds the engine's events
// address on loopback and an engine-sim process whose kv-events-config
// endpoint names that address (so it connects, as vLLM does for a host)
// dials in, on topic "kv"; replay stays dialled. A request's blocks then
// reach the index through the events alone (prediction is off): /v1/route
// shows cached tokens that it did not before.
func TestServeEventsBind(t *testing.T) {
	e2eLeakCheck(t)
	bin := e2eBuild(t)
	port, ev, rep := e2eFreePort(t), e2eFreePort(t), e2eFreePort(t)
	events, replay := fmt.Sprintf("tcp://127.0.0.1:%d", ev), fmt.Sprintf("tcp://127.0.0.1:%d", rep)
	yaml := fmt.Sprintf("health: {probe_interval: 200ms, scrape_interval: 200ms}\nmodels:\n  - name: m\n    tokenizer: %s\n"+
		"    index: {predict_ttl: -1s}\n    engines:\n      - {name: e0, url: 'http://127.0.0.1:%d', events: '%s', events_bind: true, topic: kv, replay: '%s'}\n",
		e2eQwen3Dir, port, events, replay)
	r := serveYAML(t, yaml, slog.LevelInfo)
	// The router binds the events port (not the engine).
	e2eEventually(t, 30*time.Second, "router bound "+events, func() bool {
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", ev))
		if err != nil {
			return false
		}
		c.Close()
		return true
	})

	kv := fmt.Sprintf(`{"enable_kv_cache_events":true,"publisher":"zmq","topic":"kv","endpoint":%q,"replay_endpoint":%q}`, events, replay)
	cmd := exec.Command(bin, "engine-sim", "--host", "127.0.0.1", "--port", strconv.Itoa(port),
		"--served-model-name", "m", "--profile", "fast", "--tokenizer", e2eQwen3Dir,
		"--max-model-len", "32768", "--kv-events-config", kv, "--log-level", "warn")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		waited := make(chan struct{})
		go func() { _ = cmd.Wait(); close(waited) }()
		select {
		case <-waited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-waited
		}
	})
	e2eEventually(t, 60*time.Second, "router ready with the engine's events connected", func() bool {
		resp, err := r.client.Get(r.url + "/ready?full=1")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})

	body := e2eChat(strings.Repeat("You are a careful assistant for a shipping firm. ", 20), "Where is parcel 42?")
	cached := func() int {
		t.Helper()
		resp, out := r.post("/v1/route", body)
		if resp.StatusCode != 200 {
			t.Fatalf("/v1/route: %d %s", resp.StatusCode, out)
		}
		var d struct {
			CachedTokens int `json:"cached_tokens"`
		}
		if err := json.Unmarshal([]byte(out), &d); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		return d.CachedTokens
	}
	if n := cached(); n != 0 {
		t.Fatalf("cached tokens before any request = %d", n)
	}
	if resp, out := r.post("/v1/chat/completions", body); resp.StatusCode != 200 {
		t.Fatalf("chat: %d %s", resp.StatusCode, out)
	}
	e2eEventually(t, 10*time.Second, "the request's blocks in the index", func() bool { return cached() >= 16 })
	if n := e2eMetric(t, r.url, "kvrouter_vllm_blocks_stored_total", `engine="e0"`); n == 0 {
		t.Fatal("no stored blocks counted for e0")
	}
	if n := e2eMetric(t, r.url, "kvrouter_vllm_connected", `engine="e0"`); n != 1 {
		t.Fatalf("kvrouter_vllm_connected{engine=e0} = %v", n)
	}
}

// TestServeAdminListen: with admin_listen, /metrics leaves the main
// listener for the admin one, and both listeners count their connections
// (the flags' part is cmd/kvrouter's).
func TestServeAdminListen(t *testing.T) {
	admin := fmt.Sprintf("127.0.0.1:%d", pickPort(t))
	base := startServe(t, fmt.Sprintf("admin_listen: %q\nmodels:\n  - name: m\n    tokenizer: none\n    engines: [{url: \"http://127.0.0.1:1\"}]\n", admin), slog.New(slog.DiscardHandler))
	get := func(url string) (int, string) {
		t.Helper()
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := get(base + "/metrics"); code != http.StatusNotFound {
		t.Errorf("GET /metrics on the main listener: %d, want 404", code)
	}
	code, body := get("http://" + admin + "/metrics")
	if code != 200 || !strings.Contains(body, `kvrouter_proxy_connections{listener="admin"}`) {
		t.Fatalf("GET /metrics on the admin listener: %d", code)
	}
	if code, _ := get("http://" + admin + "/health"); code != 200 {
		t.Errorf("GET /health on the admin listener: %d", code)
	}
}
