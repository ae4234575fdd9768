package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"kvrouter/internal/config"
	"kvrouter/internal/enginesim"
	"kvrouter/internal/fleet"
	"kvrouter/internal/group"
	"kvrouter/internal/tracing"

	"kvrouter/internal/testwait"
)

// pdEngine is an in-process engine-sim with a role, behind a handler that
// counts requests and records the last body and headers.
type pdEngine struct {
	name, role string
	sim        *enginesim.Server
	url        string
	requests   atomic.Int64
	lastBody   atomic.Pointer[[]byte]
	lastHeader atomic.Pointer[http.Header]
}

// pdRig is a proxy over P/D engine-sims with a real Backend.
type pdRig struct {
	t       *testing.T
	engines []*pdEngine
	backend *group.Backend
	srv     *Server
	front   *httptest.Server
	reg     *prometheus.Registry
	fleet   *fleet.Fleet
}

type pdSpec struct {
	name, role string
	faults     enginesim.Faults
	dead       bool // a closed port: connection refused
}

func newPDRig(t *testing.T, specs []pdSpec, opts ...func(*config.Model)) *pdRig {
	t.Helper()
	return newPDRigTraced(t, specs, nil, opts...)
}

// newPDRigTraced is newPDRig with the server tracing through tr (nil: off).
func newPDRigTraced(t *testing.T, specs []pdSpec, tr *tracing.Tracing, opts ...func(*config.Model)) *pdRig {
	t.Helper()
	rg := &pdRig{t: t, reg: prometheus.NewRegistry()}
	mc := config.Model{Name: "m", Tokenizer: config.TokenizerNone}
	fcfg := fleet.Config{ProbeInterval: -1, ScrapeInterval: -1}
	ctx, cancel := context.WithCancel(context.Background())
	var stops []chan error
	for _, sp := range specs {
		e := &pdEngine{name: sp.name, role: sp.role}
		if sp.dead {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			e.url = "http://" + ln.Addr().String()
			ln.Close()
		} else {
			role := enginesim.RolePrefill
			if sp.role == config.RoleDecode {
				role = enginesim.RoleDecode
			}
			sim, err := enginesim.New(enginesim.Config{ServedModelName: "m", Faults: sp.faults,
				Core: enginesim.CoreConfig{Profile: enginesim.ProfileFast, MaxModelLen: 8192, NumGPUBlocks: 4096},
				PD:   enginesim.PDConfig{Role: role, Link: "infiniband", EngineID: sp.name}}, nil, prometheus.NewRegistry())
			if err != nil {
				t.Fatal(err)
			}
			e.sim = sim
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			// The sim's own listener serves the wrapped handler.
			done := make(chan error, 1)
			hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if strings.HasPrefix(r.URL.Path, "/v1/") && r.Method == http.MethodPost {
					e.requests.Add(1)
					b, _ := readBodyCopy(r)
					e.lastBody.Store(&b)
					h := r.Header.Clone()
					e.lastHeader.Store(&h)
				}
				sim.Handler().ServeHTTP(w, r)
			})}
			simLn, err := net.Listen("tcp", "127.0.0.1:0") // the sim's engine loop needs Serve; its port is unused
			if err != nil {
				t.Fatal(err)
			}
			go func() { done <- sim.Serve(ctx, simLn) }()
			go func() { _ = hs.Serve(ln) }()
			stops = append(stops, done)
			t.Cleanup(func() { hs.Close() })
			e.url = "http://" + ln.Addr().String()
		}
		rg.engines = append(rg.engines, e)
		mc.Engines = append(mc.Engines, config.Engine{Name: e.name, URL: e.url, Role: e.role})
		fcfg.Endpoints = append(fcfg.Endpoints, fleet.EndpointConfig{Name: e.name, URL: e.url, Models: []string{"m"}})
	}
	for _, o := range opts {
		o(&mc)
	}
	cfg := config.Config{Models: []config.Model{mc}}
	cfg.FillDefaults(func(string) string { return "" })
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	fl, err := fleet.New(fcfg, nil, rg.reg)
	if err != nil {
		t.Fatal(err)
	}
	rg.fleet = fl
	var names []string
	for _, e := range rg.engines {
		names = append(names, e.name)
	}
	b, err := group.NewBackend(group.BackendConfig{Model: "m", Replicas: names, Routing: cfg.Models[0].Routing}, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	rg.backend = b
	srv, err := New(cfg, Deps{Fleet: fl, Routers: map[string]group.Router{"m": b}, Tracing: tr}, nil, rg.reg)
	if err != nil {
		t.Fatal(err)
	}
	rg.srv = srv
	rg.front = httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		rg.front.Close()
		srv.closeIdle()
		rg.checkDrained()
		cancel()
		for _, c := range stops {
			if err := <-c; err != nil {
				t.Errorf("engine-sim: %v", err)
			}
		}
	})
	return rg
}

func readBodyCopy(r *http.Request) ([]byte, error) {
	b, err := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(b))
	return b, err
}

// checkDrained asserts that both legs' leases and in-flight counters are
// back to zero.
func (rg *pdRig) checkDrained() {
	rg.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var open int64
		var inflight float64
		for _, e := range rg.engines {
			l, _ := rg.backend.Load(e.name)
			open += l.InFlight + l.QueuedPrefill + l.RunningDecode
			inflight += testutil.ToFloat64(rg.srv.m.inFlight.WithLabelValues(e.name))
			inflight += float64(rg.fleet.Endpoint(e.name).InFlight())
		}
		if open == 0 && inflight == 0 {
			return
		}
		if time.Now().After(deadline) {
			rg.t.Errorf("not drained: leases %d, in-flight %v", open, inflight)
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (rg *pdRig) engine(name string) *pdEngine {
	for _, e := range rg.engines {
		if e.name == name {
			return e
		}
	}
	rg.t.Fatalf("no engine %q", name)
	return nil
}

func (rg *pdRig) post(ctx context.Context, path, body string) *http.Response {
	rg.t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, rg.front.URL+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Connection", "X-Hop")
	req.Header.Set("X-Hop", "must not travel")
	req.Header.Set("Keep-Alive", "timeout=5")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		rg.t.Fatal(err)
	}
	return resp
}

func (rg *pdRig) pdCount(path, reason string) float64 {
	return testutil.ToFloat64(rg.srv.pdm.requests.WithLabelValues("m", path, reason))
}

// pdPrompt is a completion body with a token-id prompt of n tokens from
// base.
func pdPrompt(base, n, maxTokens int, stream bool) string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprint(base + i)
	}
	return fmt.Sprintf(`{"model":"m","prompt":[%s],"max_tokens":%d,"stream":%v}`, strings.Join(ids, ","), maxTokens, stream)
}

var twoByTwo = []pdSpec{{name: "p0", role: config.RolePrefill}, {name: "p1", role: config.RolePrefill}, {name: "d0", role: config.RoleDecode}, {name: "d1", role: config.RoleDecode}}

// TestPDTwoLegs: long prompts go through a prefill engine then a decode
// engine, for completions and chat, streaming and not. The prefill leg is
// vLLM's (max_tokens 1, no stream, do_remote_decode); the decode leg
// carries the prefill engine's kv_transfer_params and the client's own
// fields; no hop-by-hop header of the client reaches either leg.
func TestPDTwoLegs(t *testing.T) {
	rg := newPDRig(t, twoByTwo)
	chat := `{"model":"m","messages":[{"role":"user","content":"hello"}],"max_tokens":5,"stream":%v}`
	for i, tc := range []struct {
		path, body string
		stream     bool
	}{
		{"/v1/completions", pdPrompt(1, 3000, 5, false), false},
		{"/v1/completions", pdPrompt(100000, 3000, 5, true), true},
		{"/v1/chat/completions", fmt.Sprintf(chat, false), false}, // tokenizer none: prompt unknown, remote
		{"/v1/chat/completions", fmt.Sprintf(chat, true), true},
	} {
		resp := rg.post(context.Background(), tc.path, tc.body)
		body := readAll(t, resp)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%d: %d %s", i, resp.StatusCode, body)
		}
		h := resp.Header
		if h.Get("X-Kvrouter-Path") != pathDisaggregated || !strings.HasPrefix(h.Get("X-Kvrouter-Prefill-Replica"), "p") ||
			!strings.HasPrefix(h.Get("X-Kvrouter-Replica"), "d") {
			t.Fatalf("%d: headers %v", i, h)
		}
		if tc.stream != strings.Contains(body, "data: [DONE]") || !strings.Contains(body, "m") {
			t.Fatalf("%d: body %s", i, body)
		}
		p, d := rg.engine(h.Get("X-Kvrouter-Prefill-Replica")), rg.engine(h.Get("X-Kvrouter-Replica"))
		var pb, db map[string]any
		_ = json.Unmarshal(*p.lastBody.Load(), &pb)
		_ = json.Unmarshal(*d.lastBody.Load(), &db)
		ktp, _ := pb["kv_transfer_params"].(map[string]any)
		if pb["max_tokens"] != float64(1) || pb["stream"] != false || ktp["do_remote_decode"] != true {
			t.Fatalf("%d: prefill leg max_tokens %v stream %v kv_transfer_params %v", i, pb["max_tokens"], pb["stream"], ktp)
		}
		dk, _ := db["kv_transfer_params"].(map[string]any)
		if db["max_tokens"] != float64(5) || db["stream"] != tc.stream || dk["do_remote_prefill"] != true || dk["remote_engine_id"] != p.name {
			t.Fatalf("%d: decode leg max_tokens %v stream %v kv_transfer_params %v", i, db["max_tokens"], db["stream"], dk)
		}
		for _, e := range []*pdEngine{p, d} {
			if hh := *e.lastHeader.Load(); hh.Get("X-Hop") != "" || hh.Get("Keep-Alive") != "" || hh.Get("X-Request-Id") != h.Get("X-Request-Id") {
				t.Fatalf("%d: %s got headers %v", i, e.name, hh)
			}
		}
	}
	if got := rg.pdCount(pathDisaggregated, "remote") + rg.pdCount(pathDisaggregated, reasonPromptUnknown); got != 4 {
		t.Fatalf("pd requests counted %v, want 4", got)
	}
}

// TestPDConditionalBypass: a prompt whose uncached part is short is
// prefilled by the decode engine; no prefill leg is sent.
func TestPDConditionalBypass(t *testing.T) {
	rg := newPDRig(t, twoByTwo)
	resp := rg.post(context.Background(), "/v1/completions", pdPrompt(1, 200, 3, true))
	body := readAll(t, resp)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Kvrouter-Path") != pathLocal ||
		!strings.HasPrefix(resp.Header.Get("X-Kvrouter-Replica"), "d") || !strings.Contains(body, "[DONE]") {
		t.Fatalf("%d %v %s", resp.StatusCode, resp.Header, body)
	}
	if n := rg.engine("p0").requests.Load() + rg.engine("p1").requests.Load(); n != 0 {
		t.Fatalf("%d prefill legs sent for a short prompt", n)
	}
	if rg.pdCount(pathLocal, "short_prompt") != 1 {
		t.Fatal("local path not counted")
	}
	// The route explanation says the same without forwarding.
	resp = rg.post(context.Background(), "/v1/route", pdPrompt(1, 200, 3, false))
	var ex struct {
		Path    string `json:"path"`
		Verdict struct {
			Reason string `json:"reason"`
		} `json:"verdict"`
		Decode *pdPick `json:"decode"`
	}
	if err := json.Unmarshal([]byte(readAll(t, resp)), &ex); err != nil || ex.Path != pathLocal || ex.Verdict.Reason != "short_prompt" || ex.Decode == nil {
		t.Fatalf("explain %+v %v", ex, err)
	}
	resp = rg.post(context.Background(), "/v1/route", pdPrompt(1, 3000, 3, false))
	if err := json.Unmarshal([]byte(readAll(t, resp)), &ex); err != nil || ex.Path != pathDisaggregated || ex.Verdict.Reason != "remote" {
		t.Fatalf("explain long %+v %v", ex, err)
	}
}

// TestPDPrefillOnHolder: a repeated long prompt's prefill leg goes to the
// prefill engine that computed it (kv cost over the prefill pool).
func TestPDPrefillOnHolder(t *testing.T) {
	rg := newPDRig(t, twoByTwo)
	first := ""
	for i := range 4 {
		resp := rg.post(context.Background(), "/v1/completions", pdPrompt(7, 4000, 2, false))
		readAll(t, resp)
		got := resp.Header.Get("X-Kvrouter-Prefill-Replica")
		if i == 0 {
			first = got
			// an unrelated long prompt in between
			readAll(t, rg.post(context.Background(), "/v1/completions", pdPrompt(50000, 4000, 2, false)))
			continue
		}
		if got != first || resp.Header.Get("X-Kvrouter-Prefill-Cached-Tokens") == "0" {
			t.Fatalf("repeat %d: prefill on %s (cached %s), want %s, its holder", i, got, resp.Header.Get("X-Kvrouter-Prefill-Cached-Tokens"), first)
		}
	}
}

func decodeRequests(rg *pdRig) int64 {
	var n int64
	for _, e := range rg.engines {
		if e.role == config.RoleDecode {
			n += e.requests.Load()
		}
	}
	return n
}

// TestPDPrefillFails: a prefill engine that errors, or says nothing within
// the first-byte timeout, gets the client an OpenAI error within its own
// failure time (well under 1 s here); no decode leg is sent.
func TestPDPrefillFails(t *testing.T) {
	for _, tc := range []struct {
		name   string
		faults enginesim.Faults
		status int
		cause  string
	}{
		{"error", enginesim.Faults{ErrorRate: 1, ErrorStatus: 500}, http.StatusBadGateway, "status"},
		{"hang", enginesim.Faults{HangRate: 1}, http.StatusGatewayTimeout, "timeout"},
		{"bad request", enginesim.Faults{ErrorRate: 1, ErrorStatus: 400}, http.StatusBadRequest, "status"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rg := newPDRig(t, []pdSpec{{name: "p0", role: config.RolePrefill, faults: tc.faults}, {name: "d0", role: config.RoleDecode}},
				func(mc *config.Model) { mc.Timeouts.FirstByte = 300 * time.Millisecond; mc.Retries = -1 })
			t0 := time.Now()
			resp := rg.post(context.Background(), "/v1/completions", pdPrompt(1, 3000, 5, true))
			body := readAll(t, resp)
			took := time.Since(t0)
			var e struct {
				Error struct {
					Message string `json:"message"`
					Type    string `json:"type"`
				} `json:"error"`
			}
			if resp.StatusCode != tc.status || json.Unmarshal([]byte(body), &e) != nil || e.Error.Message == "" || took > time.Second {
				t.Fatalf("status %d after %v: %s", resp.StatusCode, took, body)
			}
			if n := decodeRequests(rg); n != 0 {
				t.Fatalf("%d decode legs sent after a failed prefill", n)
			}
			if testutil.ToFloat64(rg.srv.pdm.prefillFailures.WithLabelValues("m", tc.cause)) != 1 {
				t.Fatalf("prefill failure %s not counted", tc.cause)
			}
			outcome := map[int]string{http.StatusBadGateway: outcomeEngineError, http.StatusGatewayTimeout: outcomeTimeout, http.StatusBadRequest: outcomeEngineError}[tc.status]
			if testutil.ToFloat64(rg.srv.m.requests.WithLabelValues("m", "p0", outcome)) != 1 {
				t.Fatalf("request not counted as %s on p0", outcome)
			}
		})
	}
}

// TestPDCancel: a client leaving during the prefill leg cancels it (no
// decode leg); leaving during the decode stream cancels that; every lease
// is released (the rig checks at cleanup).
func TestPDCancel(t *testing.T) {
	t.Run("prefill", func(t *testing.T) {
		rg := newPDRig(t, []pdSpec{{name: "p0", role: config.RolePrefill, faults: enginesim.Faults{HangRate: 1}}, {name: "d0", role: config.RoleDecode}})
		ctx, cancel := context.WithCancel(context.Background())
		go func() {
			for rg.engine("p0").requests.Load() == 0 {
				time.Sleep(time.Millisecond) // poll: the prefill leg reached p0
			}
			cancel()
		}()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, rg.front.URL+"/v1/completions", strings.NewReader(pdPrompt(1, 3000, 5, true)))
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			t.Fatal("request survived its cancel")
		}
		testwait.For(t, "the prefill failure counted as client_closed", func() bool {
			return testutil.ToFloat64(rg.srv.pdm.prefillFailures.WithLabelValues("m", "client_closed")) == 1
		})
		if decodeRequests(rg) != 0 {
			t.Fatal("decode leg sent after the client left")
		}
	})
	t.Run("decode", func(t *testing.T) {
		rg := newPDRig(t, []pdSpec{{name: "p0", role: config.RolePrefill}, {name: "d0", role: config.RoleDecode}})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, rg.front.URL+"/v1/completions", strings.NewReader(pdPrompt(1, 3000, 4000, true)))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 64)
		if _, err := resp.Body.Read(buf); err != nil || resp.Header.Get("X-Kvrouter-Path") != pathDisaggregated {
			t.Fatalf("first bytes: %v %v", err, resp.Header)
		}
		cancel()
		resp.Body.Close()
		testwait.For(t, "the decode request counted as client_closed", func() bool {
			return testutil.ToFloat64(rg.srv.m.requests.WithLabelValues("m", "d0", outcomeClientClosed)) == 1
		})
	})
}

// TestPDDecodeDies: a decode engine that dies mid-stream ends the client's
// stream with an error event (no [DONE]); a decode engine that cannot be
// reached is replaced before the first byte by another decode engine with
// the same kv_transfer_params.
func TestPDDecodeDies(t *testing.T) {
	t.Run("mid-stream", func(t *testing.T) {
		rg := newPDRig(t, []pdSpec{{name: "p0", role: config.RolePrefill}, {name: "d0", role: config.RoleDecode, faults: enginesim.Faults{DieRate: 1, DieAfterTokens: 2}}})
		resp := rg.post(context.Background(), "/v1/completions", pdPrompt(1, 3000, 50, true))
		body := readAll(t, resp)
		if resp.StatusCode != http.StatusOK || strings.Contains(body, "[DONE]") || !strings.Contains(body, `"error"`) || len(dataLines(body)) != 3 {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
	})
	t.Run("unreachable", func(t *testing.T) {
		rg := newPDRig(t, []pdSpec{{name: "p0", role: config.RolePrefill}, {name: "d0", role: config.RoleDecode, dead: true}, {name: "d1", role: config.RoleDecode}})
		retried := 0.0
		for i := 0; i < 12 && retried == 0; i++ {
			resp := rg.post(context.Background(), "/v1/completions", pdPrompt(1, 3000, 3, false))
			body := readAll(t, resp)
			if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Kvrouter-Replica") != "d1" {
				t.Fatalf("%d %v %s", resp.StatusCode, resp.Header, body)
			}
			retried = testutil.ToFloat64(rg.srv.m.retries.WithLabelValues("m", "conn_error"))
		}
		if retried == 0 {
			t.Fatal("the unreachable decode engine was never chosen: no retry exercised")
		}
		// One prefill leg per request: the retry reused its transfer parameters.
		if got := rg.engine("p0").requests.Load(); got != rg.engine("d1").requests.Load() {
			t.Fatalf("prefill legs %d, decode legs on d1 %d", got, rg.engine("d1").requests.Load())
		}
	})
}

func TestPDConfigValidate(t *testing.T) {
	base := func() config.Config {
		return config.Config{Models: []config.Model{{Name: "m", Engines: []config.Engine{
			{Name: "p", URL: "http://127.0.0.1:1", Role: config.RolePrefill}, {Name: "d", URL: "http://127.0.0.1:2", Role: config.RoleDecode}}}}}
	}
	for _, tc := range []struct {
		name string
		edit func(*config.Config)
		want string
	}{
		{"ok", func(*config.Config) {}, ""},
		{"bad role", func(c *config.Config) { c.Models[0].Engines[0].Role = "prefiller" }, "models[0].engines[0].role"},
		{"no decode", func(c *config.Config) { c.Models[0].Engines[1].Role = config.RolePrefill }, "at least one prefill and one decode"},
		{"bad link", func(c *config.Config) { c.Models[0].PD.Link = "pigeon" }, "models[0].pd: link"},
		{"pd without roles", func(c *config.Config) {
			c.Models[0].Engines[0].Role, c.Models[0].Engines[1].Role = "", ""
			c.Models[0].PD.Mode = "always"
		}, "no engine has a role"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := base()
			tc.edit(&c)
			c.FillDefaults(func(string) string { return "" })
			err := c.Validate()
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("%v, want %q", err, tc.want)
			}
		})
	}
	// router.yaml spells it so, strictly parsed.
	cfg, _, err := config.Parse([]byte("models:\n  - name: m\n    pd: {mode: conditional, link: roce, min_remote_tokens: 512, stall_weight: 2, model: {layers: 80, kv_heads: 8, head_dim: 128, dtype_bytes: 2}}\n    engines:\n      - {url: \"http://127.0.0.1:1\", role: prefill}\n      - {url: \"http://127.0.0.1:2\", role: decode}\n"), func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	g := newPDGroup(cfg.Models[0])
	if g == nil || g.rule.Bandwidth() != 25e9 || g.rule.MinRemoteTokens != 512 || g.rule.Model.BytesPerToken() != 327680 || !g.isPrefill("127.0.0.1:1") || !g.isDecode("127.0.0.1:2") {
		t.Fatalf("parsed group %+v", g)
	}
}
