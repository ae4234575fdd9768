package enginesim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"kvrouter/internal/testwait"
)

// testServer is a Server serving on a loopback port.
type testServer struct {
	*Server
	url string
	reg *prometheus.Registry
}

// startServer starts a fast-profile server and stops it at cleanup,
// failing the test if Serve returns an error.
func startServer(t *testing.T, cfg Config) *testServer {
	t.Helper()
	if cfg.Core.Profile == "" {
		cfg.Core.Profile = ProfileFast
	}
	if cfg.Core.MaxModelLen == 0 {
		cfg.Core.MaxModelLen = 4096
	}
	if cfg.Core.NumGPUBlocks == 0 {
		cfg.Core.NumGPUBlocks = 2048
	}
	reg := prometheus.NewRegistry()
	s, err := New(cfg, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return &testServer{Server: s, url: "http://" + ln.Addr().String(), reg: reg}
}

func post(t *testing.T, url string, body any) (*http.Response, []byte) {
	t.Helper()
	b, _ := json.Marshal(body)
	resp, err := http.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, out
}

type completionOut struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Index        int     `json:"index"`
		Text         string  `json:"text"`
		FinishReason *string `json:"finish_reason"`
		Message      *struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		Delta *struct {
			Role    string  `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		TotalTokens         int `json:"total_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
}

func TestCompletionUsageAndCachedTokens(t *testing.T) {
	s := startServer(t, Config{})
	prompt := strings.Repeat("hello world ", 10) // 120 bytes = 120 tokens
	for i, wantCached := range []int{0, 112} {   // 119 rounded down to blocks of 16
		resp, body := post(t, s.url+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 5})
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
		var out completionOut
		if err := json.Unmarshal(body, &out); err != nil {
			t.Fatal(err)
		}
		u := out.Usage
		if out.Object != "text_completion" || len(out.Choices) != 1 || *out.Choices[0].FinishReason != "length" ||
			u.PromptTokens != 120 || u.CompletionTokens != 5 || u.TotalTokens != 125 || u.PromptTokensDetails.CachedTokens != wantCached {
			t.Fatalf("request %d: %s", i, body)
		}
		if got := len(strings.Fields(out.Choices[0].Text)); got != 5 {
			t.Fatalf("text %q has %d words, want 5", out.Choices[0].Text, got)
		}
	}
}

func TestCompletionPromptForms(t *testing.T) {
	s := startServer(t, Config{})
	resp, body := post(t, s.url+"/v1/completions", map[string]any{
		"prompt": []any{"abc", []int{1, 2, 3, 4}}, "max_tokens": 2, "n": 2})
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	var out completionOut
	json.Unmarshal(body, &out)
	if len(out.Choices) != 4 || out.Usage.PromptTokens != 7 || out.Usage.CompletionTokens != 8 {
		t.Fatalf("%s", body)
	}
	resp, body = post(t, s.url+"/v1/completions", map[string]any{"prompt": []int{5, 6, 7}, "max_tokens": 1})
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"prompt_tokens":3`) {
		t.Fatalf("token-id prompt: %d %s", resp.StatusCode, body)
	}
}

// sseEvents reads an SSE body into its data payloads.
func sseEvents(t *testing.T, r io.Reader) []string {
	t.Helper()
	var out []string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("not an SSE data line: %q", line)
		}
		out = append(out, data)
	}
	return out
}

func TestStreamingCompletionAndChat(t *testing.T) {
	s := startServer(t, Config{})
	for _, tc := range []struct {
		path string
		body map[string]any
	}{
		{"/v1/completions", map[string]any{"prompt": "stream me", "max_tokens": 4, "stream": true,
			"stream_options": map[string]any{"include_usage": true}}},
		{"/v1/chat/completions", map[string]any{"messages": []map[string]any{{"role": "user", "content": "hi"}},
			"max_tokens": 4, "stream": true, "stream_options": map[string]any{"include_usage": true}}},
	} {
		t.Run(tc.path, func(t *testing.T) {
			b, _ := json.Marshal(tc.body)
			resp, err := http.Post(s.url+tc.path, "application/json", bytes.NewReader(b))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
				t.Fatalf("content type %q", ct)
			}
			evs := sseEvents(t, resp.Body)
			if len(evs) < 3 || evs[len(evs)-1] != "[DONE]" {
				t.Fatalf("events %q", evs)
			}
			var tokens, finish int
			var usageSeen bool
			for _, e := range evs[:len(evs)-1] {
				var c completionOut
				if err := json.Unmarshal([]byte(e), &c); err != nil {
					t.Fatalf("chunk %q: %v", e, err)
				}
				if c.Usage != nil {
					usageSeen = true
					if len(c.Choices) != 0 || c.Usage.CompletionTokens != 4 || c.Usage.PromptTokensDetails == nil {
						t.Fatalf("usage chunk %q", e)
					}
					continue
				}
				ch := c.Choices[0]
				if ch.Delta != nil && ch.Delta.Role == "assistant" {
					continue
				}
				if ch.Text != "" || (ch.Delta != nil && ch.Delta.Content != nil) {
					tokens++
				}
				if ch.FinishReason != nil {
					finish++
				}
			}
			if tokens != 4 || finish != 1 || !usageSeen {
				t.Fatalf("tokens %d finish %d usage %v: %q", tokens, finish, usageSeen, evs)
			}
		})
	}
}

func TestChatNonStreaming(t *testing.T) {
	s := startServer(t, Config{})
	msgs := []map[string]any{{"role": "system", "content": "be brief"}, {"role": "user", "content": []map[string]any{{"type": "text", "text": "hi"}}}}
	resp, body := post(t, s.url+"/v1/chat/completions", map[string]any{"messages": msgs, "max_completion_tokens": 3})
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	var out completionOut
	json.Unmarshal(body, &out)
	want, _ := ByteTokenizer{}.EncodeChat([]byte(`{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}]}`))
	if out.Object != "chat.completion" || out.Choices[0].Message.Role != "assistant" || out.Usage.PromptTokens != len(want) {
		t.Fatalf("%s (want %d prompt tokens)", body, len(want))
	}
	// /tokenize gives the same ids for the same chat.
	resp, body = post(t, s.url+"/tokenize", map[string]any{"messages": msgs})
	var tk tokenizeResponse
	json.Unmarshal(body, &tk)
	if resp.StatusCode != 200 || tk.Count != len(want) || tk.MaxModelLen != 4096 {
		t.Fatalf("tokenize chat: %s", body)
	}
	resp, body = post(t, s.url+"/tokenize", map[string]any{"prompt": "héllo"})
	json.Unmarshal(body, &tk)
	if resp.StatusCode != 200 || tk.Count != 6 || tk.Tokens[1] != 0xc3 {
		t.Fatalf("tokenize prompt: %s", body)
	}
}

func TestErrors(t *testing.T) {
	s := startServer(t, Config{Core: CoreConfig{MaxModelLen: 64, NumGPUBlocks: 64}})
	for _, tc := range []struct {
		name   string
		path   string
		body   any
		status int
		typ    string
	}{
		{"too long", "/v1/completions", map[string]any{"prompt": strings.Repeat("x", 65)}, 400, "BadRequestError"},
		{"max_tokens too large", "/v1/completions", map[string]any{"prompt": "abc", "max_tokens": 62}, 400, "BadRequestError"},
		{"bad json", "/v1/completions", "{", 400, "BadRequestError"},
		{"unknown model", "/v1/completions", map[string]any{"model": "nope", "prompt": "a"}, 404, "NotFoundError"},
		{"empty prompt", "/v1/completions", map[string]any{"prompt": ""}, 400, "BadRequestError"},
		{"no prompt", "/v1/completions", map[string]any{}, 400, "BadRequestError"},
		{"no messages", "/v1/chat/completions", map[string]any{}, 400, "BadRequestError"},
		{"bad n", "/v1/completions", map[string]any{"prompt": "a", "n": 0}, 400, "BadRequestError"},
		{"empty salt", "/v1/completions", map[string]any{"prompt": "a", "cache_salt": ""}, 400, "BadRequestError"},
		{"out of vocab", "/v1/completions", map[string]any{"prompt": []int{1 << 30}}, 400, "BadRequestError"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b []byte
			if str, ok := tc.body.(string); ok {
				b = []byte(str)
			} else {
				b, _ = json.Marshal(tc.body)
			}
			resp, err := http.Post(s.url+tc.path, "application/json", bytes.NewReader(b))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var e struct {
				Error struct {
					Message string  `json:"message"`
					Type    string  `json:"type"`
					Param   *string `json:"param"`
					Code    int     `json:"code"`
				} `json:"error"`
			}
			if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != tc.status || e.Error.Type != tc.typ || e.Error.Code != tc.status || e.Error.Message == "" {
				t.Fatalf("status %d %+v", resp.StatusCode, e)
			}
		})
	}
}

func TestModelsHealthMetrics(t *testing.T) {
	s := startServer(t, Config{ServedModelName: "m", LoRAModules: []string{"ad"}, Core: CoreConfig{NumCPUBlocks: 8}})
	resp, err := http.Get(s.url + "/health")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("health %v %v", resp, err)
	}
	resp.Body.Close()
	resp, err = http.Get(s.url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var models struct {
		Data []struct {
			ID          string  `json:"id"`
			Parent      *string `json:"parent"`
			MaxModelLen *int    `json:"max_model_len"`
		} `json:"data"`
	}
	json.NewDecoder(resp.Body).Decode(&models)
	resp.Body.Close()
	// vLLM: max_model_len on the base model's card, null on an adapter's.
	if len(models.Data) != 2 || models.Data[0].ID != "m" || models.Data[0].MaxModelLen == nil || *models.Data[0].MaxModelLen != 4096 ||
		*models.Data[1].Parent != "m" || models.Data[1].MaxModelLen != nil {
		t.Fatalf("models %+v", models)
	}
	for range 2 {
		if r, b := post(t, s.url+"/v1/completions", map[string]any{"model": "ad", "prompt": strings.Repeat("z", 40), "max_tokens": 2}); r.StatusCode != 200 {
			t.Fatalf("%d %s", r.StatusCode, b)
		}
	}
	resp, err = http.Get(s.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	text, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`vllm:num_requests_running{engine="0",model_name="m"} 0`,
		`vllm:num_requests_waiting{engine="0",model_name="m"} 0`,
		`vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0`,
		`vllm:prefix_cache_queries_total{engine="0",model_name="m"} 80`,
		`vllm:prefix_cache_hits_total{engine="0",model_name="m"} 32`,
		`vllm:num_preemptions_total{engine="0",model_name="m"} 0`,
		`vllm:external_prefix_cache_queries_total{engine="0",model_name="m"} 48`,
		`vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="0",num_cpu_blocks="8",num_gpu_blocks="2048",num_gpu_blocks_override="2048",prefix_caching_hash_algo="fast"} 1`,
		`vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 2`,
	} {
		if !strings.Contains(string(text), want+"\n") {
			t.Errorf("metrics lack %s", want)
		}
	}
	if n, err := testutil.GatherAndCount(s.reg, "vllm:time_to_first_token_seconds"); err != nil || n != 1 {
		t.Errorf("ttft histogram: %d %v", n, err)
	}
}

// TestClientDisconnectAborts: a client leaving mid-stream aborts its
// request in the engine and frees its blocks.
func TestClientDisconnectAborts(t *testing.T) {
	s := startServer(t, Config{Core: CoreConfig{Timing: Timing{StepOverhead: 2 * time.Millisecond}}})
	ctx, cancel := context.WithCancel(context.Background())
	b, _ := json.Marshal(map[string]any{"prompt": strings.Repeat("q", 100), "max_tokens": 3000, "stream": true})
	req, _ := http.NewRequestWithContext(ctx, "POST", s.url+"/v1/completions", bytes.NewReader(b))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first line %q %v", line, err)
	}
	if st := s.state.Load(); st.running != 1 || st.usage == 0 {
		t.Fatalf("running %d usage %v", st.running, st.usage)
	}
	cancel()
	resp.Body.Close()
	testwait.For(t, "abort", func() bool {
		st := s.state.Load()
		return st.running == 0 && st.usage == 0 && st.stats.Aborted == 1
	})
}

func TestFaults(t *testing.T) {
	t.Run("error", func(t *testing.T) {
		s := startServer(t, Config{Faults: Faults{ErrorRate: 1, ErrorStatus: 503}})
		resp, body := post(t, s.url+"/v1/completions", map[string]any{"prompt": "a"})
		if resp.StatusCode != 503 || !strings.Contains(string(body), `"type":"ServiceUnavailableError"`) {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
	})
	t.Run("die mid-stream", func(t *testing.T) {
		s := startServer(t, Config{Faults: Faults{DieRate: 1, DieAfterTokens: 2}})
		b, _ := json.Marshal(map[string]any{"prompt": "a", "max_tokens": 50, "stream": true})
		resp, err := http.Post(s.url+"/v1/completions", "application/json", bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		data, err := io.ReadAll(resp.Body)
		if err == nil || strings.Contains(string(data), "[DONE]") {
			t.Fatalf("stream should break without [DONE]: err %v, %q", err, data)
		}
		testwait.For(t, "abort after death", func() bool { return s.state.Load().running == 0 })
	})
	// Exactly k token chunks, even when one step yields more (n choices
	// decode together: 3 tokens per step).
	t.Run("die after exactly k tokens", func(t *testing.T) {
		s := startServer(t, Config{Faults: Faults{DieRate: 1, DieAfterTokens: 2}})
		for _, n := range []int{1, 3} {
			for range 5 {
				b, _ := json.Marshal(map[string]any{"prompt": "a", "max_tokens": 50, "stream": true, "n": n})
				resp, err := http.Post(s.url+"/v1/completions", "application/json", bytes.NewReader(b))
				if err != nil {
					t.Fatal(err)
				}
				data, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if got := strings.Count(string(data), `"text":`); got != 2 {
					t.Fatalf("n=%d: %d token chunks before dying, want 2:\n%s", n, got, data)
				}
			}
		}
	})
	t.Run("hang", func(t *testing.T) {
		s := startServer(t, Config{Faults: Faults{HangRate: 1}})
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		b, _ := json.Marshal(map[string]any{"prompt": "a"})
		req, _ := http.NewRequestWithContext(ctx, "POST", s.url+"/v1/completions", bytes.NewReader(b))
		if _, err := http.DefaultClient.Do(req); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("want a hang until the deadline, got %v", err)
		}
	})
	t.Run("spike", func(t *testing.T) {
		s := startServer(t, Config{Faults: Faults{SpikeRate: 1, SpikeDelay: 150 * time.Millisecond}})
		start := time.Now()
		if resp, _ := post(t, s.url+"/v1/completions", map[string]any{"prompt": "a", "max_tokens": 1}); resp.StatusCode != 200 {
			t.Fatal(resp.Status)
		}
		if el := time.Since(start); el < 150*time.Millisecond {
			t.Fatalf("spike not applied: %v", el)
		}
	})
	t.Run("slow start", func(t *testing.T) {
		f := Faults{SlowStart: 10 * time.Second, SlowStartFactor: 5}
		f, _ = f.withDefaults()
		if got := f.slowFactor(0); got != 5 {
			t.Fatalf("factor at 0: %v", got)
		}
		if got := f.slowFactor(5 * time.Second); got != 3 {
			t.Fatalf("factor at half: %v", got)
		}
		if got := f.slowFactor(11 * time.Second); got != 1 {
			t.Fatalf("factor after: %v", got)
		}
	})
}

func TestRestartCutsStreams(t *testing.T) {
	s := startServer(t, Config{Core: CoreConfig{Timing: Timing{StepOverhead: 2 * time.Millisecond}}})
	post(t, s.url+"/v1/completions", map[string]any{"prompt": strings.Repeat("r", 64), "max_tokens": 1})
	b, _ := json.Marshal(map[string]any{"prompt": "x", "max_tokens": 3000, "stream": true})
	resp, err := http.Post(s.url+"/v1/completions", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	if r, body := post(t, s.url+"/admin/restart", nil); r.StatusCode != 200 {
		t.Fatalf("restart %d %s", r.StatusCode, body)
	}
	if data, err := io.ReadAll(br); err == nil || strings.Contains(string(data), "[DONE]") {
		t.Fatalf("stream survived a restart: %v", err)
	}
	st := s.state.Load()
	if st.running != 0 || st.stats.PrefixQueries != 0 {
		t.Fatalf("state after restart %+v", st)
	}
	// The cache is empty: the first prompt no longer hits.
	_, body := post(t, s.url+"/v1/completions", map[string]any{"prompt": strings.Repeat("r", 64), "max_tokens": 1})
	if !strings.Contains(string(body), `"cached_tokens":0`) {
		t.Fatalf("hit after restart: %s", body)
	}
}

// TestRecoverErr: every goroutine of Serve and of a publisher session runs
// under recoverErr, which turns a panic into an error and passes results on.
func TestRecoverErr(t *testing.T) {
	if err := recoverErr("x", func() error { panic("boom") }); err == nil || err.Error() != "enginesim: x panicked: boom" {
		t.Errorf("panic: got %v", err)
	}
	want := errors.New("plain")
	if err := recoverErr("x", func() error { return want }); err != want {
		t.Errorf("error: got %v, want %v", err, want)
	}
	if err := recoverErr("x", func() error { return nil }); err != nil {
		t.Errorf("nil: got %v", err)
	}
}

// TestDrainGate: once draining, every new request is answered 503 in
// vLLM's error shape and its connection closed, without reaching the
// handler; before, requests pass and are counted while in flight.
func TestDrainGate(t *testing.T) {
	inside := make(chan int64, 1)
	var g *drainGate
	g = &drainGate{next: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		inside <- g.inFlight.Load()
		w.WriteHeader(http.StatusNoContent)
	})}
	rec := httptest.NewRecorder()
	g.ServeHTTP(rec, mustRequest(t))
	if rec.Code != http.StatusNoContent || <-inside != 1 || g.inFlight.Load() != 0 {
		t.Fatalf("before draining: status %d, in flight after %d", rec.Code, g.inFlight.Load())
	}
	g.draining.Store(true)
	rec = httptest.NewRecorder()
	g.ServeHTTP(rec, mustRequest(t))
	var body struct {
		Error struct {
			Type string `json:"type"`
			Code int    `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || rec.Code != http.StatusServiceUnavailable ||
		body.Error.Type != "ServiceUnavailableError" || body.Error.Code != 503 || rec.Header().Get("Connection") != "close" {
		t.Fatalf("draining: status %d, Connection %q, body %s (%v)", rec.Code, rec.Header().Get("Connection"), rec.Body.String(), err)
	}
	select {
	case <-inside:
		t.Fatal("a request reached the handler while draining")
	default:
	}
}

func mustRequest(t *testing.T) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://engine/v1/completions", strings.NewReader(`{"prompt":"hi"}`))
	if err != nil {
		t.Fatal(err)
	}
	return req
}
