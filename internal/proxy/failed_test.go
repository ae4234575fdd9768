package proxy

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"kvrouter/internal/config"
	"kvrouter/internal/fleet"
	"kvrouter/internal/group"
	"kvrouter/internal/kvindex"
)

// backendRig is a Server routing with a real Backend (event-fed index, kv
// policy) in front of test engines, for what the index records.
type backendRig struct {
	*rig
	backend *group.Backend
}

func newBackendRig(t *testing.T, n int, mod func(*config.Config)) *backendRig {
	t.Helper()
	rg := &rig{t: t, router: &testRouter{}, reg: prometheus.NewRegistry()}
	cfg := config.Config{Models: []config.Model{{Name: "m", Tokenizer: config.TokenizerNone}}}
	fcfg := fleet.Config{ProbeInterval: -1, ScrapeInterval: -1}
	var names []string
	for i := range n {
		e := newEngine(t, fmt.Sprintf("e%d", i))
		rg.engines = append(rg.engines, e)
		names = append(names, e.name)
		cfg.Models[0].Engines = append(cfg.Models[0].Engines, config.Engine{Name: e.name, URL: e.srv.URL})
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
	b, err := group.NewBackend(group.BackendConfig{Model: "m", Replicas: names, Exact: true}, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := New(cfg, Deps{Fleet: fl, Routers: map[string]group.Router{"m": b}, Gatherer: rg.reg}, nil, rg.reg)
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

func (br *backendRig) indexStats() kvindex.Stats { return br.backend.IndexStats() }

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
			br := newBackendRig(t, 1, func(c *config.Config) { c.Models[0].Retries = -1 })
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

// TestTooLongAnsweredWithoutForwarding: once the engines' max_model_len is
// read from their /v1/models (4096 in the test engine), a prompt whose
// tokens plus requested output exceed it is answered with vLLM's own 400
// and never reaches an engine; what fits is forwarded; too_long: forward
// forwards everything.
func TestTooLongAnsweredWithoutForwarding(t *testing.T) {
	for _, mode := range []string{config.TooLongReject, config.TooLongForward} {
		t.Run(mode, func(t *testing.T) {
			rg := newRig(t, 1, func(c *config.Config, _ *fleet.Config) { c.Models[0].TooLong = mode })
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- rg.srv.Run(ctx, ln) }()
			fleetDone := make(chan error, 1)
			go func() { fleetDone <- rg.fleet.Run(ctx) }() // its model check reads /v1/models
			t.Cleanup(func() { cancel(); <-done; <-fleetDone })
			deadline := time.Now().Add(5 * time.Second)
			for rg.srv.core.MaxModelLen("m") != 4096 {
				if time.Now().After(deadline) {
					t.Fatal("max_model_len not learned from /v1/models")
				}
				time.Sleep(5 * time.Millisecond)
			}
			base := "http://" + ln.Addr().String()
			post := func(body string) (int, string) {
				t.Helper()
				resp, err := rg.client.Post(base+"/v1/completions", "application/json", strings.NewReader(body))
				if err != nil {
					t.Fatal(err)
				}
				return resp.StatusCode, readAll(t, resp)
			}
			ids := func(n int) string {
				s := make([]string, n)
				for i := range s {
					s[i] = "7"
				}
				return strings.Join(s, ",")
			}
			tests := []struct {
				name     string
				body     string
				rejected bool // under reject
				msg      string
			}{
				{"prompt over", `{"model":"m","prompt":[` + ids(4097) + `]}`, true,
					"This model's maximum context length is 4096 tokens. However, you requested 0 output tokens and your prompt contains 4097 input tokens, for a total of 4097 tokens. Please reduce the length of the input prompt or the number of requested output tokens. (parameter=input_tokens, value=4097)"},
				{"prompt plus max_tokens over", `{"model":"m","max_tokens":100,"prompt":[` + ids(4000) + `]}`, true,
					"However, you requested 100 output tokens and your prompt contains 4000 input tokens, for a total of 4100 tokens."},
				{"exactly fits", `{"model":"m","max_tokens":96,"prompt":[` + ids(4000) + `]}`, false, ""},
				{"prompt of max_model_len, no max_tokens", `{"model":"m","prompt":[` + ids(4096) + `]}`, false, ""},
				{"text prompt, tokens unknown", `{"model":"m","max_tokens":5000,"prompt":"hi"}`, false, ""},
			}
			for _, tt := range tests {
				before := rg.engines[0].requests.Load()
				status, body := post(tt.body)
				forwarded := rg.engines[0].requests.Load() - before
				if tt.rejected && mode == config.TooLongReject {
					if status != 400 || forwarded != 0 {
						t.Errorf("%s: status %d, %d forwarded; want 400 and none: %s", tt.name, status, forwarded, body)
						continue
					}
					e := errorOf(t, body)
					if e.Type != "BadRequestError" || e.Code != 400 || e.Param == nil || *e.Param != "input_tokens" || !strings.Contains(e.Message, tt.msg) {
						t.Errorf("%s: error %+v, want vLLM's with %q", tt.name, e, tt.msg)
					}
					continue
				}
				if status != 200 || forwarded != 1 {
					t.Errorf("%s: status %d, %d forwarded; want 200 and 1: %s", tt.name, status, forwarded, body)
				}
			}
		})
	}
}
