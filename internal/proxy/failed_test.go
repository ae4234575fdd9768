package proxy

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"kvrouter/internal/fleet"
	"kvrouter/internal/kvindex"
)

// backendRig is a Server routing with a real Backend (event-fed index, kv
// policy) in front of test engines, for what the index records.
type backendRig struct {
	*rig
	backend *Backend
}

func newBackendRig(t *testing.T, n int, mod func(*Config)) *backendRig {
	t.Helper()
	rg := &rig{t: t, router: &testRouter{}, reg: prometheus.NewRegistry()}
	cfg := Config{Models: []ModelConfig{{Name: "m", Tokenizer: TokenizerNone}}}
	fcfg := fleet.Config{ProbeInterval: -1, ScrapeInterval: -1}
	var names []string
	for i := range n {
		e := newEngine(t, fmt.Sprintf("e%d", i))
		rg.engines = append(rg.engines, e)
		names = append(names, e.name)
		cfg.Models[0].Engines = append(cfg.Models[0].Engines, EngineConfig{Name: e.name, URL: e.srv.URL})
		fcfg.Endpoints = append(fcfg.Endpoints, fleet.EndpointConfig{Name: e.name, URL: e.srv.URL, Models: []string{"m"}})
	}
	if mod != nil {
		mod(&cfg)
	}
	cfg.FillDefaults(func(string) string { return "" })
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	fl, err := fleet.New(fcfg, nil, rg.reg)
	if err != nil {
		t.Fatal(err)
	}
	rg.fleet = fl
	b, err := NewBackend(BackendConfig{Model: "m", Replicas: names, Exact: true}, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := New(cfg, Deps{Fleet: fl, Routers: map[string]Router{"m": b}, Gatherer: rg.reg}, nil, rg.reg)
	if err != nil {
		t.Fatal(err)
	}
	rg.srv = srv
	rg.front = httptest.NewServer(srv.Handler())
	rg.client = &http.Client{Transport: &http.Transport{DisableCompression: true}}
	t.Cleanup(func() {
		rg.front.Close()
		rg.client.CloseIdleConnections()
		srv.closeIdle()
	})
	return &backendRig{rig: rg, backend: b}
}

func (br *backendRig) indexStats() kvindex.Stats { return br.backend.cur.Load().exact.Stats() }

// tokenPrompt is a completion of n token ids (16 per block).
func tokenPrompt(n int, stream bool) string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprint(100 + i)
	}
	return fmt.Sprintf(`{"model":"m","stream":%t,"prompt":[%s]}`, stream, strings.Join(ids, ","))
}

// TestFailedRequestDropsPredictions: a request the engine answers with an
// error status, or with an error event inside a 200 stream, has its
// predicted blocks dropped at once (before, they showed as cached tokens
// on the replica for the prediction TTL); a request answered whole keeps
// them until the engine's events confirm them.
func TestFailedRequestDropsPredictions(t *testing.T) {
	const prompt = 16 * 32 // 32 blocks
	tests := []struct {
		name    string
		set     func(e *engine)
		stream  bool
		status  int
		outcome string
		live    int64 // predicted blocks left
	}{
		{"200 kept", func(e *engine) {}, false, 200, outcomeOK, 32},
		{"400 dropped", func(e *engine) { e.status = 400 }, false, 400, outcomeEngineError, 0},
		{"500 dropped", func(e *engine) { e.status = 500 }, true, 500, outcomeEngineError, 0},
		{"stream error event dropped", func(e *engine) { e.errEvent = true }, true, 200, outcomeEngineError, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			br := newBackendRig(t, 1, func(c *Config) { c.Models[0].Retries = -1 })
			br.engines[0].set(tt.set)
			resp := br.post("/v1/completions", tokenPrompt(prompt, tt.stream))
			body := readAll(t, resp)
			if resp.StatusCode != tt.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tt.status, body)
			}
			if tt.name == "stream error event dropped" && !strings.Contains(body, `data: {"error": {"message": "engine failed"`) {
				t.Errorf("error event not relayed as sent:\n%s", body)
			}
			s := br.indexStats()
			if s.Predicted != 32 || s.PredictedLive != tt.live || s.Cancelled != 32-tt.live {
				t.Errorf("predicted %d, live %d, cancelled %d; want 32, %d, %d", s.Predicted, s.PredictedLive, s.Cancelled, tt.live, 32-tt.live)
			}
			if got := testutil.ToFloat64(br.srv.m.requests.WithLabelValues("m", "e0", tt.outcome)); got != 1 {
				t.Errorf("outcome %s counted %v times", tt.outcome, got)
			}
			// What the next request of that prompt is told is cached there.
			resp = br.post("/v1/route", tokenPrompt(prompt, false))
			readAll(t, resp)
			want := "0"
			if tt.live > 0 {
				want = fmt.Sprint(prompt - 16) // whole blocks, at most prompt-1 tokens
			}
			if got := resp.Header.Get("X-Kvrouter-Cached-Tokens"); got != want {
				t.Errorf("cached tokens after the answer: %s, want %s", got, want)
			}
		})
	}
}

// TestRetriedReplicaPredictionsDropped: a 503 from the first replica drops
// what was predicted there; the replica that serves keeps its prediction.
func TestRetriedReplicaPredictionsDropped(t *testing.T) {
	br := newBackendRig(t, 2, nil)
	for _, e := range br.engines {
		e.set(func(e *engine) { e.status = 503 })
	}
	resp := br.post("/v1/completions", tokenPrompt(16*8, false))
	body := readAll(t, resp)
	if resp.StatusCode != 503 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	if s := br.indexStats(); s.Predicted != 16 || s.Cancelled != 16 || s.PredictedLive != 0 {
		t.Errorf("both replicas answered 503: predicted %d, cancelled %d, live %d; want 16, 16, 0", s.Predicted, s.Cancelled, s.PredictedLive)
	}
}

func TestHasErrorEvent(t *testing.T) {
	tests := []struct {
		in   string
		want bool
	}{
		{"data: {\"error\": {\"message\": \"x\"}}\n\n", true},
		{"data:{\"error\":{}}\n\n", true},
		{"data: {\"id\":\"c\"}\n\ndata: {\"error\": {}}\n\n", true},
		{"data: {\"id\":\"c\",\"choices\":[{\"delta\":{\"content\":\"{\\\"error\\\": 1}\"}}]}\n\n", false}, // escaped in a string
		{"data: {\"id\":\"c\",\"x\":{\"error\":1}}\n\n", false},                                            // a nested key
		{"data: [DONE]\n\n", false},
		{"event: x\ndata: {\"error\":1}\n\n", true},
		{"xdata: {\"error\":1}\n\n", false},
	}
	for _, tt := range tests {
		if got := hasErrorEvent([]byte(tt.in)); got != tt.want {
			t.Errorf("hasErrorEvent(%q) = %v, want %v", tt.in, got, tt.want)
		}
	}
}
