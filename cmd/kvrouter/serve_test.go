package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
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

func TestServeQuickFlags(t *testing.T) {
	var errb bytes.Buffer
	fl, err := parseServeFlags([]string{"--listen", "127.0.0.1:0", "--model", "llama",
		"--engine", "http://a:8000", "--engine", "http://b:8000", "--engine", "http://c:8000",
		"--events", "tcp://a:5557", "--events", "tcp://b:5557", "--events", "tcp://c:5557",
		"--replay", "tcp://a:5558", "--replay", "tcp://b:5558", "--replay", "tcp://c:5558",
		"--tokenizer", "none", "--policy", "least_load"}, func(string) string { return "" }, stdio{out: &errb, err: &errb})
	if err != nil {
		t.Fatal(err)
	}
	c := fl.cfg
	if c.Listen != "127.0.0.1:0" || len(c.Models) != 1 {
		t.Fatalf("%+v", c)
	}
	m := c.Models[0]
	if m.Name != "llama" || m.Tokenizer != "none" || m.Policy != "least_load" || len(m.Engines) != 3 {
		t.Fatalf("%+v", m)
	}
	want := [][3]string{{"http://a:8000", "tcp://a:5557", "tcp://a:5558"}, {"http://b:8000", "tcp://b:5557", "tcp://b:5558"}, {"http://c:8000", "tcp://c:5557", "tcp://c:5558"}}
	for i, w := range want {
		if e := m.Engines[i]; e.URL != w[0] || e.Events != w[1] || e.Replay != w[2] {
			t.Errorf("engine %d = %+v, want %v", i, e, w)
		}
	}
}

func TestServeFlagErrors(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	os.WriteFile(good, []byte("models: [{name: m, engines: [{url: 'http://a:1'}]}]\n"), 0o644)
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("models:\n  - name: m\n    engines:\n      - url: 'http://a:1'\n        event: tcp://a:5557\n"), 0o644)
	tests := []struct {
		name  string
		args  []string
		usage bool
		want  string
	}{
		{"nothing", nil, true, "want --config FILE"},
		{"engine without model", []string{"--engine", "http://a:1"}, true, "want --config"},
		{"more events than engines", []string{"--model", "m", "--engine", "http://a:1", "--events", "tcp://a:1", "--events", "tcp://b:1"}, true, "more --events"},
		{"fewer events than engines", []string{"--model", "m", "--engine", "http://a:1", "--engine", "http://b:1", "--engine", "http://c:1", "--events", "tcp://a:1", "--events", "tcp://b:1"}, true, "2 --events for 3 --engine: give one --events per --engine, in --engine order, or none"},
		{"fewer replays than engines", []string{"--model", "m", "--engine", "http://a:1", "--engine", "http://b:1", "--events", "tcp://a:1", "--events", "tcp://b:1", "--replay", "tcp://a:2"}, true, "1 --replay for 2 --engine: give one --replay per --engine"},
		{"config and quick form", []string{"--config", good, "--model", "m"}, true, "excludes"},
		{"bad policy", []string{"--model", "m", "--engine", "http://a:1", "--policy", "best"}, true, `unknown policy "best"`},
		{"bad url", []string{"--model", "m", "--engine", "a:1"}, true, "want http(s)"},
		{"unknown field in file", []string{"--config", bad}, false, `models[0].engines[0].event (line 5): unknown field "event"`},
		{"udp events", []string{"--model", "m", "--engine", "http://a:1", "--events", "udp://x"}, true, `models[0].engines[0].events: "udp://x": unsupported transport`},
		{"missing file", []string{"--config", filepath.Join(dir, "nope.yaml")}, false, "no such file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b bytes.Buffer
			_, err := parseServeFlags(tt.args, func(string) string { return "" }, stdio{out: &b, err: &b})
			if err == nil {
				t.Fatal("want an error")
			}
			if errors.Is(err, errUsage) != tt.usage {
				t.Errorf("usage error = %v, want %v (%v)", errors.Is(err, errUsage), tt.usage, err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q lacks %q", err, tt.want)
			}
		})
	}
	fl, err := parseServeFlags([]string{"--config", good, "--listen", "127.0.0.1:9"}, func(string) string { return "" }, stdio{})
	if err != nil || fl.cfg.Listen != "127.0.0.1:9" || fl.cfg.Models[0].Policy != "kv" {
		t.Errorf("config + --listen: %+v %v", fl, err)
	}
}

// TestServeCommandStartupError runs "kvrouter serve" through run() as main
// does with configurations that cannot start: start-up fails naming the
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

// TestRecovered: the wrapper every serve/demo/engine-sim goroutine runs
// under turns a panic into an error naming the goroutine and passes
// results through.
func TestRecovered(t *testing.T) {
	err := recovered("fleet", func() error { panic("boom") })()
	if err == nil || !strings.HasPrefix(err.Error(), "fleet panicked: boom\n") || !strings.Contains(err.Error(), "goroutine") {
		t.Errorf("panic: got %v", err)
	}
	want := errors.New("plain")
	if err := recovered("x", func() error { return want })(); err != want {
		t.Errorf("error: got %v, want %v", err, want)
	}
	if err := recovered("x", func() error { return nil })(); err != nil {
		t.Errorf("nil: got %v", err)
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

// TestServeQuickEventsBind: --events-bind makes kvrouter bind every
// --events address of the quick form; without it a wildcard is refused.
func TestServeQuickEventsBind(t *testing.T) {
	var errb bytes.Buffer
	sio := stdio{out: &errb, err: &errb}
	args := []string{"--model", "m", "--engine", "http://a:1", "--engine", "http://b:1", "--events", "tcp://*:5557", "--events", "tcp://*:5558"}
	fl, err := parseServeFlags(append(args, "--events-bind"), func(string) string { return "" }, sio)
	if err != nil {
		t.Fatal(err)
	}
	if e := fl.cfg.Models[0].Engines; !e[0].EventsBind || e[0].Events != "tcp://*:5557" || !e[1].EventsBind || e[1].Events != "tcp://*:5558" {
		t.Fatalf("engines %+v", e)
	}
	if _, err := parseServeFlags(args, func(string) string { return "" }, sio); err == nil || !strings.Contains(err.Error(), "events_bind: true binds it") {
		t.Fatalf("wildcard without --events-bind: %v", err)
	}
	_, err = parseServeFlags([]string{"--model", "m", "--engine", "http://a:1", "--engine", "http://b:1",
		"--events", "tcp://127.0.0.1:5557", "--events", "tcp://127.0.0.1:5557", "--events-bind"}, func(string) string { return "" }, sio)
	if err == nil || !strings.Contains(err.Error(), "already bound") {
		t.Fatalf("two engines on one bound address: %v", err)
	}
}

// TestServeQuickEventsQueue: --events-queue sets every engine's KV event
// queue (default 1024); a value out of range is a usage error naming the
// field.
func TestServeQuickEventsQueue(t *testing.T) {
	var errb bytes.Buffer
	sio := stdio{out: &errb, err: &errb}
	args := []string{"--model", "m", "--engine", "http://a:1", "--engine", "http://b:1", "--events", "tcp://127.0.0.1:5557", "--events", "tcp://127.0.0.1:5558"}
	for _, tc := range []struct {
		flags []string
		want  int
	}{{nil, 1024}, {[]string{"--events-queue", "8192"}, 8192}} {
		fl, err := parseServeFlags(append(args, tc.flags...), func(string) string { return "" }, sio)
		if err != nil {
			t.Fatal(err)
		}
		if e := fl.cfg.Models[0].Engines; e[0].EventsQueue != tc.want || e[1].EventsQueue != tc.want {
			t.Fatalf("%v: engines %+v, want events_queue %d", tc.flags, e, tc.want)
		}
	}
	_, err := parseServeFlags(append(args, "--events-queue", "-3"), func(string) string { return "" }, sio)
	if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), "events_queue: -3: must be in 1..1048576") {
		t.Fatalf("--events-queue -3: %v", err)
	}
}

// TestServeQuickEventsAllOrNone: the quick form takes one --events per
// --engine or none (every engine on the approximate index); fewer is refused
// (TestServeFlagErrors), since the event-fed index never sees the rest.
func TestServeQuickEventsAllOrNone(t *testing.T) {
	var errb bytes.Buffer
	sio := stdio{out: &errb, err: &errb}
	two := []string{"--model", "m", "--engine", "http://a:1", "--engine", "http://b:1"}
	fl, err := parseServeFlags(two, func(string) string { return "" }, sio)
	if err != nil {
		t.Fatalf("no --events: %v", err)
	}
	if e := fl.cfg.Models[0].Engines; len(e) != 2 || e[0].Events != "" || e[1].Events != "" {
		t.Fatalf("no --events: engines %+v", e)
	}
	fl, err = parseServeFlags(append(two, "--events", "tcp://a:5557", "--events", "tcp://b:5557"), func(string) string { return "" }, sio)
	if err != nil {
		t.Fatalf("one --events each: %v", err)
	}
	if e := fl.cfg.Models[0].Engines; e[0].Events != "tcp://a:5557" || e[1].Events != "tcp://b:5557" {
		t.Fatalf("one --events each: engines %+v", e)
	}
}

// The listener flags override router.yaml; with admin_listen, /metrics
// leaves the main listener for the admin one, and both listeners count
// their connections.
func TestServeAdminListen(t *testing.T) {
	var errb bytes.Buffer
	fl, err := parseServeFlags([]string{"--model", "m", "--engine", "http://a:8000", "--tokenizer", "none",
		"--admin-listen", "127.0.0.1:9999", "--max-connections", "77", "--header-timeout", "3s",
		"--body-idle-timeout", "4s", "--idle-timeout", "5s"}, func(string) string { return "" }, stdio{out: &errb, err: &errb})
	if err != nil {
		t.Fatal(err)
	}
	if h := fl.cfg.HTTP; fl.cfg.AdminListen != "127.0.0.1:9999" || h.MaxConnections != 77 || h.HeaderTimeout != 3*time.Second ||
		h.BodyIdleTimeout != 4*time.Second || h.IdleTimeout != 5*time.Second || h.ReservedConnections != 32 {
		t.Fatalf("flags not applied: admin %q, http %+v", fl.cfg.AdminListen, h)
	}

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
