package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"kvrouter/internal/config"
	"kvrouter/internal/fleet"
	"kvrouter/internal/group"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// engine is a loopback HTTP server speaking enough of vLLM's OpenAI API for
// the proxy: chat and text completions (streaming and not), /health,
// /v1/models. Its behaviour is switched per test.
type engine struct {
	t    *testing.T
	name string
	srv  *httptest.Server

	mu        sync.Mutex
	status    int           // answer this status with an error body (0: normal)
	chunks    int           // content events per stream (default 3)
	failAfter int           // break the connection after this many events (0: never)
	block     bool          // hold the request until the client cancels
	noDone    bool          // end streams cleanly without data: [DONE] (an engine stopped by SIGTERM)
	errEvent  bool          // after the first event, an error event as vLLM sends it, then [DONE]
	gap       time.Duration // pause between events
	step      chan struct{} // when set, wait for a token before each event
	frozen    chan struct{} // when set, every request (/health too) waits until it is closed: a stopped process
	bodies    [][]byte
	headers   []http.Header

	requests atomic.Int32
	canceled chan struct{} // receives when a held request's ctx ends
	started  chan struct{} // receives when a request arrives (non-blocking)
}

func newEngine(t *testing.T, name string) *engine {
	e := &engine{t: t, name: name, chunks: 3, canceled: make(chan struct{}, 16), started: make(chan struct{}, 256)}
	e.srv = httptest.NewServer(http.HandlerFunc(e.serve))
	t.Cleanup(e.srv.Close)
	return e
}

func (e *engine) set(f func(e *engine)) {
	e.mu.Lock()
	defer e.mu.Unlock()
	f(e)
}

func (e *engine) lastBody() []byte {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.bodies) == 0 {
		return nil
	}
	return e.bodies[len(e.bodies)-1]
}

func (e *engine) lastHeader() http.Header {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.headers) == 0 {
		return nil
	}
	return e.headers[len(e.headers)-1]
}

func (e *engine) serve(w http.ResponseWriter, r *http.Request) {
	e.mu.Lock()
	frozen := e.frozen
	e.mu.Unlock()
	if frozen != nil {
		select {
		case <-frozen:
		case <-r.Context().Done():
			return
		}
	}
	switch r.URL.Path {
	case "/health":
		return
	case "/v1/models":
		fmt.Fprintf(w, `{"object":"list","data":[{"id":"m","object":"model","owned_by":"%s","max_model_len":4096}]}`, e.name)
		return
	case "/v1/completions", "/v1/chat/completions":
	default:
		http.NotFound(w, r)
		return
	}
	e.requests.Add(1)
	select {
	case e.started <- struct{}{}:
	default:
	}
	body, _ := io.ReadAll(r.Body)
	e.mu.Lock()
	e.bodies = append(e.bodies, body)
	e.headers = append(e.headers, r.Header.Clone())
	status, chunks, failAfter, block, gap, step, noDone, errEvent := e.status, e.chunks, e.failAfter, e.block, e.gap, e.step, e.noDone, e.errEvent
	e.mu.Unlock()
	if block {
		<-r.Context().Done()
		e.canceled <- struct{}{}
		return
	}
	if status != 0 {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		fmt.Fprintf(w, `{"error":{"message":"engine says %d","type":"BadRequestError","param":null,"code":%d}}`, status, status)
		return
	}
	var req struct {
		Stream bool `json:"stream"`
	}
	_ = json.Unmarshal(body, &req)
	w.Header().Set("X-Engine", e.name)
	w.Header().Set("Connection", "X-Secret")
	w.Header().Set("X-Secret", "hop")
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"cmpl-1","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"%s"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":%d,"total_tokens":%d}}`,
			strings.Repeat("x", chunks), chunks, chunks+5)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	rc := http.NewResponseController(w)
	w.WriteHeader(http.StatusOK)
	_ = rc.Flush() // like Starlette's StreamingResponse: headers before the first event
	for i := range chunks {
		if step != nil {
			select {
			case <-step:
			case <-r.Context().Done():
				e.canceled <- struct{}{}
				return
			}
		}
		if failAfter > 0 && i == failAfter {
			panic(http.ErrAbortHandler)
		}
		fmt.Fprintf(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t%d\"},\"finish_reason\":null}]}\n\n", i)
		_ = rc.Flush()
		if errEvent {
			io.WriteString(w, "data: {\"error\": {\"message\": \"engine failed\", \"type\": \"BadRequestError\", \"param\": null, \"code\": 400}}\n\n")
			break
		}
		if gap > 0 {
			time.Sleep(gap) // the engine's pace between events: the delay under test
		}
	}
	if !noDone {
		io.WriteString(w, "data: [DONE]\n\n")
	}
}

// testRouter picks by a function, default: the first candidate; it counts
// open leases so tests can check every exit path releases.
type testRouter struct {
	pick   func(in *group.RouteInput) string
	route  func(in *group.RouteInput) (string, error) // when set, replaces pick and may fail
	open   atomic.Int64
	calls  atomic.Int64
	mu     sync.Mutex
	inputs []group.RouteInput
}

func (r *testRouter) Route(in *group.RouteInput) (group.Decision, error) {
	r.calls.Add(1)
	r.mu.Lock()
	r.inputs = append(r.inputs, *in)
	r.mu.Unlock()
	name := in.Candidates[0]
	if r.pick != nil {
		name = r.pick(in)
	}
	if r.route != nil {
		var err error
		if name, err = r.route(in); err != nil {
			return group.Decision{}, err
		}
	}
	d := group.Decision{Replica: name, CachedTokens: 16 * len(in.Candidates), Explain: map[string]any{"candidates": in.Candidates}}
	if !in.DryRun {
		r.open.Add(1)
		var once sync.Once
		d.Release = func() { once.Do(func() { r.open.Add(-1) }) }
	}
	return d, nil
}

// rig is a proxy in front of engines, with its own registry.
type rig struct {
	t       *testing.T
	engines []*engine
	fleet   *fleet.Fleet
	router  *testRouter
	srv     *Server
	front   *httptest.Server
	reg     *prometheus.Registry
	client  *http.Client

	mu        sync.Mutex
	connected map[string]bool // Deps.EventsConnected's answer
}

// setConnected sets whose KV event streams count as connected.
func (rg *rig) setConnected(names ...string) {
	rg.mu.Lock()
	defer rg.mu.Unlock()
	rg.connected = map[string]bool{}
	for _, n := range names {
		rg.connected[n] = true
	}
}

type rigOption func(*config.Config, *fleet.Config)

func newRig(t *testing.T, n int, opts ...rigOption) *rig {
	t.Helper()
	return newRigRouter(t, n, nil, opts...)
}

// newRigRouter is newRig with router as model m's Router (nil: the rig's
// testRouter).
func newRigRouter(t *testing.T, n int, router group.Router, opts ...rigOption) *rig {
	t.Helper()
	rg := &rig{t: t, router: &testRouter{}, reg: prometheus.NewRegistry()}
	if router == nil {
		router = rg.router
	}
	var eps []testEndpoint
	for i := range n {
		e := newEngine(t, fmt.Sprintf("e%d", i))
		rg.engines = append(rg.engines, e)
		eps = append(eps, testEndpoint{name: e.name, url: e.srv.URL})
	}
	cfg := config.Config{Models: []config.Model{{Name: "m", Tokenizer: config.TokenizerNone}}}
	fcfg := fleet.Config{ProbeInterval: -1, ScrapeInterval: -1}
	for _, ep := range eps {
		cfg.Models[0].Engines = append(cfg.Models[0].Engines, config.Engine{Name: ep.name, URL: ep.url})
		fcfg.Endpoints = append(fcfg.Endpoints, fleet.EndpointConfig{Name: ep.name, URL: ep.url, Models: []string{"m"}})
	}
	for _, o := range opts {
		o(&cfg, &fcfg)
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
	events := func() map[string]bool {
		rg.mu.Lock()
		defer rg.mu.Unlock()
		return maps.Clone(rg.connected)
	}
	srv, err := New(cfg, Deps{Fleet: fl, Routers: map[string]group.Router{"m": router}, Gatherer: rg.reg, EventsConnected: events}, nil, rg.reg)
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
		rg.checkDrained()
	})
	return rg
}

type testEndpoint struct{ name, url string }

// checkDrained asserts that leases and in-flight counters are back to zero.
func (rg *rig) checkDrained() {
	rg.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		open := rg.router.open.Load()
		var inflight float64
		for _, e := range rg.engines {
			inflight += testutil.ToFloat64(rg.srv.m.inFlight.WithLabelValues(e.name))
			if ep := rg.fleet.Endpoint(e.name); ep != nil { // nil: removed by the test
				inflight += float64(ep.InFlight())
			}
		}
		if open == 0 && inflight == 0 {
			return
		}
		if time.Now().After(deadline) {
			rg.t.Errorf("not drained: %d open leases, in-flight %v", open, inflight)
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (rg *rig) post(path, body string, hdr ...string) *http.Response {
	rg.t.Helper()
	return rg.postCtx(context.Background(), path, body, hdr...)
}

func (rg *rig) postCtx(ctx context.Context, path, body string, hdr ...string) *http.Response {
	rg.t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, rg.front.URL+path, strings.NewReader(body))
	if err != nil {
		rg.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := rg.client.Do(req)
	if err != nil {
		rg.t.Fatal(err)
	}
	return resp
}

func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading response: %v", err)
	}
	return string(b)
}

// counter reads kvrouter_proxy_requests_total for one outcome.
func (rg *rig) outcome(replica, outcome string) float64 {
	return testutil.ToFloat64(rg.srv.m.requests.WithLabelValues("m", replica, outcome))
}

const chatBody = `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
const chatStream = `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`

func dataLines(s string) []string {
	var out []string
	for l := range strings.Lines(s) {
		if strings.HasPrefix(l, "data: ") {
			out = append(out, strings.TrimSpace(l))
		}
	}
	return out
}

var _ = bytes.Equal
var _ = slices.Contains[[]string]

// errorBody is OpenAI's error JSON, as the tests read it.
type errorBody struct {
	Error errorDetail `json:"error"`
}

type errorDetail struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    int     `json:"code"`
}
