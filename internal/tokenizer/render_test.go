package tokenizer

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// fakeEngine is an httptest vLLM stand-in. render says whether it serves
// the render endpoints; bodies records each request body by path.
type fakeEngine struct {
	render bool
	hits   map[string]*atomic.Int64
	bodies map[string]chan []byte
	// answer returns the token ids for a decoded request body.
	answer func(path string, body map[string]json.RawMessage) []uint32
}

func newFakeEngine(t *testing.T, render bool, answer func(string, map[string]json.RawMessage) []uint32) (*fakeEngine, *httptest.Server) {
	t.Helper()
	e := &fakeEngine{render: render, answer: answer, hits: map[string]*atomic.Int64{}, bodies: map[string]chan []byte{}}
	for _, p := range []string{pathChatRender, pathCompletionRender, pathTokenize} {
		e.hits[p] = new(atomic.Int64)
		e.bodies[p] = make(chan []byte, 16)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits, ok := e.hits[r.URL.Path]
		if !ok || (!e.render && r.URL.Path != pathTokenize) {
			w.WriteHeader(http.StatusNotFound)
			io.WriteString(w, `{"detail":"Not Found"}`)
			return
		}
		hits.Add(1)
		raw, _ := io.ReadAll(r.Body)
		select {
		case e.bodies[r.URL.Path] <- raw:
		default:
		}
		var body map[string]json.RawMessage
		if err := json.Unmarshal(raw, &body); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			io.WriteString(w, `{"error":{"message":"bad json","type":"BadRequestError","code":400}}`)
			return
		}
		ids := e.answer(r.URL.Path, body)
		idsJSON, _ := json.Marshal(ids)
		switch r.URL.Path {
		case pathChatRender:
			io.WriteString(w, `{"request_id":"x","token_ids":`+string(idsJSON)+`,"features":null,"sampling_params":{"max_tokens":1}}`)
		case pathCompletionRender:
			io.WriteString(w, `[{"request_id":"x","token_ids":`+string(idsJSON)+`,"sampling_params":{}}]`)
		default:
			io.WriteString(w, `{"count":`+itoa(len(ids))+`,"max_model_len":40960,"tokens":`+string(idsJSON)+`}`)
		}
	}))
	t.Cleanup(srv.Close)
	return e, srv
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

// histCount returns how many observations kvrouter_tokenizer_render_seconds
// holds for endpoint and outcome.
func histCount(t *testing.T, reg *prometheus.Registry, endpoint, outcome string) uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "kvrouter_tokenizer_render_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["endpoint"] == endpoint && labels["outcome"] == outcome {
				return m.GetHistogram().GetSampleCount()
			}
		}
	}
	return 0
}

const chatBody = `{"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi","name":"z"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"z":1,"a":2}}}],"add_generation_prompt":true,"chat_template_kwargs":{"enable_thinking":false}}`

func TestRemoteRender(t *testing.T) {
	engine, srv := newFakeEngine(t, true, func(path string, body map[string]json.RawMessage) []uint32 {
		if path == pathCompletionRender {
			return []uint32{1, 2, 3}
		}
		return []uint32{7, 8, 9, 10}
	})
	reg := prometheus.NewRegistry()
	r, err := NewRemote(RemoteConfig{URL: srv.URL + "/", Model: "qwen3"}, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	var req ChatRequest
	if err := json.Unmarshal([]byte(chatBody), &req); err != nil {
		t.Fatal(err)
	}
	ids, err := r.Chat(t.Context(), req)
	if err != nil || !equalIDs(ids, []uint32{7, 8, 9, 10}) {
		t.Fatalf("Chat = %v, %v", ids, err)
	}
	got := <-engine.bodies[pathChatRender]
	for _, want := range []string{
		`"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi","name":"z"}]`,
		`"tools":[{"type":"function","function":{"name":"f","parameters":{"z":1,"a":2}}}]`,
		`"chat_template_kwargs":{"enable_thinking":false}`,
		`"add_generation_prompt":true`,
		`"model":"qwen3"`,
	} {
		if !strings.Contains(string(got), want) {
			t.Errorf("chat render body %s lacks %s", got, want)
		}
	}
	if strings.Contains(string(got), "add_special_tokens") {
		t.Errorf("chat render body %s has add_special_tokens", got)
	}
	ids, err = r.Completion(t.Context(), "hello", true)
	if err != nil || !equalIDs(ids, []uint32{1, 2, 3}) {
		t.Fatalf("Completion = %v, %v", ids, err)
	}
	if got := string(<-engine.bodies[pathCompletionRender]); !strings.Contains(got, `"prompt":"hello"`) || !strings.Contains(got, `"add_special_tokens":true`) {
		t.Errorf("completion render body %s", got)
	}
	if n := engine.hits[pathTokenize].Load(); n != 0 {
		t.Errorf("/tokenize called %d times on an engine with render", n)
	}
	if histCount(t, reg, "chat_render", "ok") != 1 || histCount(t, reg, "completion_render", "ok") != 1 {
		t.Errorf("render histogram lacks the two ok calls")
	}
}

func TestRemoteFallsBackToTokenize(t *testing.T) {
	engine, srv := newFakeEngine(t, false, func(path string, body map[string]json.RawMessage) []uint32 {
		if _, chat := body["messages"]; chat {
			return []uint32{4, 5}
		}
		return []uint32{6}
	})
	reg := prometheus.NewRegistry()
	r, err := NewRemote(RemoteConfig{URL: srv.URL}, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	r.now = func() time.Time { return now }
	var req ChatRequest
	if err := json.Unmarshal([]byte(chatBody), &req); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		ids, err := r.Chat(t.Context(), req)
		if err != nil || !equalIDs(ids, []uint32{4, 5}) {
			t.Fatalf("Chat #%d = %v, %v", i, ids, err)
		}
	}
	got := string(<-engine.bodies[pathTokenize])
	<-engine.bodies[pathTokenize] // the second chat
	for _, want := range []string{`"add_special_tokens":false`, `"add_generation_prompt":true`, `"tools":[`, `"chat_template_kwargs":{"enable_thinking":false}`} {
		if !strings.Contains(got, want) {
			t.Errorf("/tokenize chat body %s lacks %s", got, want)
		}
	}
	ids, err := r.Completion(t.Context(), "x", false)
	if err != nil || !equalIDs(ids, []uint32{6}) {
		t.Fatalf("Completion = %v, %v", ids, err)
	}
	if got := string(<-engine.bodies[pathTokenize]); !strings.Contains(got, `"add_special_tokens":false`) || !strings.Contains(got, `"prompt":"x"`) {
		t.Errorf("/tokenize prompt body %s", got)
	}
	// One 404 was enough: later calls went straight to /tokenize.
	if n := histCount(t, reg, "chat_render", "unavailable"); n != 1 {
		t.Errorf("chat_render unavailable observations = %d, want 1", n)
	}
	if n := histCount(t, reg, "tokenize", "ok"); n != 3 {
		t.Errorf("tokenize ok observations = %d, want 3", n)
	}
	// After RenderRetry the render endpoint is tried again.
	now = now.Add(DefaultRemoteConfig(RemoteConfig{}).RenderRetry)
	if _, err := r.Chat(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	if n := histCount(t, reg, "chat_render", "unavailable"); n != 2 {
		t.Errorf("after render_retry: chat_render unavailable observations = %d, want 2", n)
	}
}

func TestRemoteErrors(t *testing.T) {
	tests := []struct {
		name       string
		status     int
		body       string
		wantStatus int
		wantMsg    string
	}{
		{"vllm 400", 400, `{"error":{"message":"messages: field required","type":"BadRequestError","code":400}}`, 400, "messages: field required"},
		{"old vllm error shape", 400, `{"object":"error","message":"too long","type":"BadRequestError","code":400}`, 400, "too long"},
		{"model not found is not a missing route", 404, `{"error":{"message":"The model x does not exist.","type":"NotFoundError","code":404}}`, 404, "does not exist"},
		{"server error", 500, `internal`, 500, "internal"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var tokenizeHits atomic.Int64
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == pathTokenize {
					tokenizeHits.Add(1)
				}
				w.WriteHeader(tt.status)
				io.WriteString(w, tt.body)
			}))
			defer srv.Close()
			reg := prometheus.NewRegistry()
			r, err := NewRemote(RemoteConfig{URL: srv.URL}, nil, reg)
			if err != nil {
				t.Fatal(err)
			}
			_, err = r.Completion(t.Context(), "x", true)
			var ee *EngineError
			if !errors.As(err, &ee) || ee.Status != tt.wantStatus || !strings.Contains(ee.Message, tt.wantMsg) {
				t.Fatalf("Completion error = %v, want EngineError %d %q", err, tt.wantStatus, tt.wantMsg)
			}
			if ee.Endpoint != pathCompletionRender || tokenizeHits.Load() != 0 {
				t.Errorf("error from %s after %d /tokenize calls; want render, 0", ee.Endpoint, tokenizeHits.Load())
			}
			if histCount(t, reg, "completion_render", "error") != 1 {
				t.Error("error not observed in the render histogram")
			}
		})
	}
}

func TestRemoteTimeout(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	defer srv.Close()
	defer close(release)
	reg := prometheus.NewRegistry()
	r, err := NewRemote(RemoteConfig{URL: srv.URL, Timeout: 50 * time.Millisecond}, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	_, err = r.Tokenize(t.Context(), "x", true)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Tokenize error = %v, want deadline exceeded", err)
	}
	if histCount(t, reg, "tokenize", "timeout") != 1 {
		t.Error("timeout not observed in the render histogram")
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := r.Tokenize(ctx, "x", true); !errors.Is(err, context.Canceled) {
		t.Fatalf("Tokenize on a canceled ctx: %v", err)
	}
}

func TestNewRemoteConfigErrors(t *testing.T) {
	for _, cfg := range []RemoteConfig{{}, {URL: "10.0.0.1:8000"}, {URL: "http://x", Timeout: -1}} {
		if _, err := NewRemote(cfg, nil, nil); err == nil {
			t.Errorf("NewRemote(%+v): no error", cfg)
		}
	}
	// Two Remotes share one registry.
	reg := prometheus.NewRegistry()
	for range 2 {
		if _, err := NewRemote(RemoteConfig{URL: "http://127.0.0.1:1"}, nil, reg); err != nil {
			t.Fatal(err)
		}
	}
}

func equalIDs(a, b []uint32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestRemoteNoRenderLoggedOnce: a burst of requests that all find the
// render endpoint missing logs "no render endpoint" once; so does the retry
// after render_retry that finds it still missing; when the engine serves it
// again, one line says so.
func TestRemoteNoRenderLoggedOnce(t *testing.T) {
	var render atomic.Bool
	var waiting atomic.Int64 // requests held at the missing render endpoint
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		switch {
		case r.URL.Path == pathTokenize:
			io.WriteString(w, `{"count":1,"max_model_len":40960,"tokens":[7]}`)
		case render.Load():
			io.WriteString(w, `[{"request_id":"x","token_ids":[7],"sampling_params":{}}]`)
		default:
			waiting.Add(1)
			<-release // every request of the burst is in flight before any answer
			waiting.Add(-1)
			w.WriteHeader(http.StatusNotFound)
			io.WriteString(w, `{"detail":"Not Found"}`)
		}
	}))
	t.Cleanup(srv.Close)
	var logs strings.Builder
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return logs.Write(p)
	}), nil))
	r, err := NewRemote(RemoteConfig{URL: srv.URL}, log, nil)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	r.now = func() time.Time { return now }
	burst := func(n int) {
		t.Helper()
		var wg sync.WaitGroup
		var done atomic.Int64
		for range n {
			wg.Go(func() {
				defer done.Add(1)
				if ids, err := r.Completion(context.Background(), "x", true); err != nil || !equalIDs(ids, []uint32{7}) {
					t.Errorf("Completion = %v, %v", ids, err)
				}
			})
		}
		// Every request of the burst is either held at the engine or done
		// (answered another way) before the engine answers any.
		for deadline := time.Now().Add(10 * time.Second); waiting.Load()+done.Load() < int64(n); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("burst of %d: %d held at the engine, %d done after 10 s", n, waiting.Load(), done.Load())
			}
		}
		close(release)
		wg.Wait()
		release = make(chan struct{})
	}
	count := func(msg string) int {
		mu.Lock()
		defer mu.Unlock()
		return strings.Count(logs.String(), msg)
	}
	burst(30)
	if n := count("no render endpoint"); n != 1 {
		t.Fatalf("%d lines after a burst of 30, want 1:\n%s", n, logs.String())
	}
	now = now.Add(DefaultRemoteConfig(RemoteConfig{}).RenderRetry) // retry: still missing
	burst(10)
	if n := count("no render endpoint"); n != 1 {
		t.Fatalf("%d lines after the retry, want 1:\n%s", n, logs.String())
	}
	render.Store(true)
	now = now.Add(DefaultRemoteConfig(RemoteConfig{}).RenderRetry)
	burst(5)
	if n := count("render endpoint again"); n != 1 {
		t.Fatalf("%d recovery lines, want 1:\n%s", n, logs.String())
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
