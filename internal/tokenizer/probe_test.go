package tokenizer

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

var (
	qwen3Once  sync.Once
	qwen3Local *Local
	qwen3Err   error
)

// sharedQwen3 loads the Qwen3 tokenizer once for the probe tests.
func sharedQwen3(t testing.TB) *Local {
	t.Helper()
	qwen3Once.Do(func() {
		tok, err := Load(qwen3Dir)
		if err != nil {
			qwen3Err = err
			return
		}
		qwen3Local, qwen3Err = NewLocal(tok, ContentAuto)
	})
	if qwen3Err != nil {
		t.Fatal(qwen3Err)
	}
	return qwen3Local
}

// tokenizeEngine serves vLLM's /tokenize with the real Qwen3 tokenizer.
// While corrupt is set it changes the id at position corruptAt of the
// answer for corruptProbe ("text" or "chat").
type tokenizeEngine struct {
	local        *Local
	corrupt      atomic.Bool
	corruptAt    int
	corruptProbe string
	fail         atomic.Bool
}

func (e *tokenizeEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/tokenize" {
		http.NotFound(w, r)
		return
	}
	if e.fail.Load() {
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, `{"error":{"message":"engine sleeping","code":503}}`)
		return
	}
	var body struct {
		Prompt           *string `json:"prompt"`
		AddSpecialTokens *bool   `json:"add_special_tokens"`
	}
	raw, _ := io.ReadAll(r.Body)
	if err := json.Unmarshal(raw, &body); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var ids []uint32
	probe := "chat"
	if body.Prompt != nil {
		probe = "text"
		ids = e.local.Encode(*body.Prompt, body.AddSpecialTokens == nil || *body.AddSpecialTokens)
	} else {
		var req ChatRequest
		if err := json.Unmarshal(raw, &req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var err error
		if _, ids, err = e.local.EncodeChat(req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
	}
	if e.corrupt.Load() && probe == e.corruptProbe {
		ids[e.corruptAt]++
	}
	json.NewEncoder(w).Encode(map[string]any{"count": len(ids), "max_model_len": 40960, "tokens": ids})
}

func newProbeFixture(t *testing.T, reaction Reaction, probe string, at int) (*tokenizeEngine, *Probe, *Source, *prometheus.Registry) {
	t.Helper()
	local := sharedQwen3(t)
	engine := &tokenizeEngine{local: local, corruptAt: at, corruptProbe: probe}
	srv := httptest.NewServer(engine)
	t.Cleanup(srv.Close)
	reg := prometheus.NewRegistry()
	remote, err := NewRemote(RemoteConfig{URL: srv.URL}, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	src, err := NewSource(local, remote)
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewProbe(ProbeConfig{Engine: "e1", Reaction: reaction}, local, remote, src, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	return engine, p, src, reg
}

func mismatchGauge(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	g, err := newMetrics(reg) // returns the registered collectors
	if err != nil {
		t.Fatal(err)
	}
	return testutil.ToFloat64(g.mismatch.WithLabelValues("e1"))
}

func TestProbeAgrees(t *testing.T) {
	for _, r := range []Reaction{ReactRefuse, ReactRender, ReactContinue} {
		_, p, src, reg := newProbeFixture(t, r, "chat", 0)
		if err := p.Check(t.Context()); err != nil {
			t.Fatalf("%s: Check against an agreeing engine: %v", r, err)
		}
		if mismatchGauge(t, reg) != 0 || src.UsingEngine() {
			t.Errorf("%s: gauge %v, using engine %v; want 0, false", r, mismatchGauge(t, reg), src.UsingEngine())
		}
	}
}

func TestProbeMismatch(t *testing.T) {
	local := sharedQwen3(t)
	_, chatIDs, err := local.EncodeChat(probeChat)
	if err != nil {
		t.Fatal(err)
	}
	textIDs := local.Encode(probeText, true)
	tests := []struct {
		reaction  Reaction
		probe     string
		at        int
		wantErr   bool
		useEngine bool
	}{
		{ReactRefuse, "text", 3, true, false},
		{ReactRefuse, "chat", 9, true, false},
		{ReactRender, "chat", 9, false, true},
		{ReactContinue, "text", 0, false, false},
	}
	for _, tt := range tests {
		t.Run(string(tt.reaction)+"/"+tt.probe, func(t *testing.T) {
			engine, p, src, reg := newProbeFixture(t, tt.reaction, tt.probe, tt.at)
			engine.corrupt.Store(true)
			err := p.Check(t.Context())
			if tt.wantErr != (err != nil) {
				t.Fatalf("Check = %v, want error %v", err, tt.wantErr)
			}
			if mismatchGauge(t, reg) != 1 {
				t.Errorf("mismatch gauge = %v, want 1", mismatchGauge(t, reg))
			}
			if src.UsingEngine() != tt.useEngine {
				t.Errorf("UsingEngine = %v, want %v", src.UsingEngine(), tt.useEngine)
			}
			// The error (returned or, for the other reactions, the one
			// compare finds) names the first differing position.
			mm, cerr := p.compare(t.Context())
			if cerr != nil || mm == nil {
				t.Fatalf("compare = %v, %v", mm, cerr)
			}
			if err != nil {
				var got *MismatchError
				if !errors.As(err, &got) || !errors.Is(err, ErrMismatch) || *got != *mm {
					t.Errorf("Check error %v is not the mismatch %v", err, mm)
				}
			}
			ids := textIDs
			if tt.probe == "chat" {
				ids = chatIDs
			}
			want := MismatchError{Engine: "e1", Probe: tt.probe, Index: tt.at,
				Local: int64(ids[tt.at]), Remote: int64(ids[tt.at] + 1), LocalLen: len(ids), RemoteLen: len(ids),
				Context:    local.Decode(ids[max(0, tt.at-8):tt.at]),
				LocalPiece: local.Decode(ids[tt.at : tt.at+1]), RemotePiece: local.Decode([]uint32{ids[tt.at] + 1})}
			if *mm != want {
				t.Errorf("mismatch = %+v\nwant %+v", *mm, want)
			}
			if msg := mm.Error(); !strings.Contains(msg, "token "+itoa(tt.at)) || !strings.Contains(msg, tt.probe+" probe") {
				t.Errorf("error text %q lacks the position or the probe", msg)
			}
			// The engine is fixed: the next probe agrees, the gauge clears
			// and the render reaction hands tokenization back.
			engine.corrupt.Store(false)
			if err := p.Check(t.Context()); err != nil {
				t.Fatal(err)
			}
			if mismatchGauge(t, reg) != 0 || src.UsingEngine() {
				t.Errorf("after agreement: gauge %v, using engine %v", mismatchGauge(t, reg), src.UsingEngine())
			}
			p.Close()
			if n := testutil.CollectAndCount(reg, "kvrouter_tokenizer_mismatch"); n != 0 {
				t.Errorf("after Close: %d mismatch series, want 0", n)
			}
		})
	}
}

func TestProbeLengthMismatch(t *testing.T) {
	local := sharedQwen3(t)
	p := &Probe{cfg: ProbeConfig{Engine: "e1"}, local: local}
	ids := local.Encode("hello world", false)
	mm := p.diff("text", ids, append(ids[:len(ids):len(ids)], 13))
	if mm == nil || mm.Index != len(ids) || mm.Local != -1 || mm.Remote != 13 {
		t.Fatalf("diff with a longer engine answer = %+v", mm)
	}
	if p.diff("text", ids, ids) != nil {
		t.Fatal("diff of equal ids is not nil")
	}
}

func TestProbeEngineDown(t *testing.T) {
	engine, p, src, reg := newProbeFixture(t, ReactRefuse, "text", 0)
	engine.fail.Store(true)
	err := p.Check(t.Context())
	var ee *EngineError
	if !errors.As(err, &ee) || errors.Is(err, ErrMismatch) || ee.Status != http.StatusServiceUnavailable {
		t.Fatalf("Check against a failing engine = %v, want an EngineError 503", err)
	}
	if mismatchGauge(t, reg) != 0 || src.UsingEngine() {
		t.Error("an engine failure changed the mismatch state")
	}
}

func TestNewProbeConfigErrors(t *testing.T) {
	local := sharedQwen3(t)
	remote, err := NewRemote(RemoteConfig{URL: "http://127.0.0.1:1"}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, cfg := range []ProbeConfig{{}, {Engine: "e", Reaction: "panic"}, {Engine: "e", Reaction: ReactRender}, {Engine: "e", Interval: -time.Second}} {
		if _, err := NewProbe(cfg, local, remote, nil, nil, nil); err == nil {
			t.Errorf("NewProbe(%+v): no error", cfg)
		}
	}
}

// countingEngine answers /tokenize in memory with the local ids.
type countingEngine struct {
	local *Local
	calls atomic.Int64
}

func (c *countingEngine) Tokenize(_ context.Context, prompt string, add bool) ([]uint32, error) {
	c.calls.Add(1)
	return c.local.Encode(prompt, add), nil
}

func (c *countingEngine) TokenizeChat(_ context.Context, req ChatRequest) ([]uint32, error) {
	_, ids, err := c.local.EncodeChat(req)
	return ids, err
}

func TestProbeRun(t *testing.T) {
	local := sharedQwen3(t)
	synctest.Test(t, func(t *testing.T) {
		engine := &countingEngine{local: local}
		p, err := NewProbe(ProbeConfig{Engine: "e1", Reaction: ReactContinue, Interval: time.Minute}, local, engine, nil, nil, prometheus.NewRegistry())
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error)
		go func() { done <- p.Run(ctx) }()
		time.Sleep(p.firstDelay() + 3*time.Minute + time.Second)
		synctest.Wait()
		if n := engine.calls.Load(); n != 4 {
			t.Errorf("probes after first delay + 3 intervals = %d, want 4", n)
		}
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v, want nil after cancel", err)
		}
	})
}

func TestSourceFallsBackForUnsupported(t *testing.T) {
	local := sharedQwen3(t)
	engine, srv := newFakeEngine(t, true, func(string, map[string]json.RawMessage) []uint32 { return []uint32{42} })
	remote, err := NewRemote(RemoteConfig{URL: srv.URL}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	src, err := NewSource(local, remote)
	if err != nil {
		t.Fatal(err)
	}
	image := ChatRequest{Messages: []byte(`[{"role":"user","content":[{"type":"image_url","image_url":{"url":"http://x/a.png"}},{"type":"text","text":"what is it?"}]}]`), AddGenerationPrompt: true}
	ids, err := src.Chat(t.Context(), image)
	if err != nil || !equalIDs(ids, []uint32{42}) || engine.hits[pathChatRender].Load() != 1 {
		t.Fatalf("Chat with an image = %v, %v; want the engine's render", ids, err)
	}
	ids, err = src.Chat(t.Context(), probeChat)
	_, want, _ := local.EncodeChat(probeChat)
	if err != nil || !equalIDs(ids, want) || engine.hits[pathChatRender].Load() != 1 {
		t.Fatalf("plain Chat = %v, %v; want local ids", ids, err)
	}
	ids, err = src.Completion(t.Context(), "hi", false)
	if err != nil || !equalIDs(ids, local.Encode("hi", false)) {
		t.Fatalf("Completion = %v, %v", ids, err)
	}
	onlyEngine, err := NewSource(nil, remote)
	if err != nil || !onlyEngine.UsingEngine() {
		t.Fatalf("NewSource(nil, remote) = %v, %v", onlyEngine, err)
	}
	if _, err := NewSource(nil, nil); err == nil {
		t.Fatal("NewSource(nil, nil): no error")
	}
}
