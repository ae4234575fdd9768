package fleet

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
	"go.uber.org/goleak"

	"kvrouter/internal/vllm/enginemetrics"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeEngines answers probes in memory: health[name] says whether GET
// /health of that endpoint returns 200.
type fakeEngines struct {
	mu     sync.Mutex
	health map[string]bool
	probes map[string]int
}

func (f *fakeEngines) RoundTrip(r *http.Request) (*http.Response, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.probes[r.URL.Host+r.URL.Path]++
	code := 503
	if f.health[r.URL.Host] {
		code = 200
	}
	if r.URL.Path == "/metrics" {
		code = 200
	}
	return &http.Response{StatusCode: code, Body: io.NopCloser(strings.NewReader("ok")), Request: r}, nil
}

func (f *fakeEngines) set(host string, ok bool) {
	f.mu.Lock()
	f.health[host] = ok
	f.mu.Unlock()
}

func newTestFleet(t *testing.T, cfg Config) (*Fleet, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	f, err := New(cfg, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	return f, reg
}

func twoEndpoints() []EndpointConfig {
	return []EndpointConfig{
		{URL: "http://a:1", Models: []string{"m"}},
		{URL: "http://b:1", Models: []string{"m"}},
	}
}

func names(eps []*Endpoint) []string {
	var out []string
	for _, e := range eps {
		out = append(out, e.Name())
	}
	return out
}

func TestNewErrors(t *testing.T) {
	_, err := New(Config{Endpoints: []EndpointConfig{
		{URL: "ftp://x", Models: []string{"m"}},
		{URL: "http://a:1"},
		{URL: "http://b:1", Models: []string{"m"}},
		{URL: "http://b:1/", Models: []string{"m"}},
	}}, nil, nil)
	if err == nil {
		t.Fatal("want error")
	}
	for _, want := range []string{`endpoints[0]: url "ftp://x"`, "endpoints[1]: http://a:1: no models", `endpoints[3]: duplicate name "b:1"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	if _, err := New(Config{}, nil, nil); err == nil {
		t.Error("no endpoints: want error")
	}
}

func TestReport(t *testing.T) {
	now := time.Unix(1000, 0)
	tests := []struct {
		name     string
		outcomes []Outcome
		wantUp   bool
	}{
		{"ok", []Outcome{OutcomeOK}, true},
		{"one conn error ejects", []Outcome{OutcomeConnError}, false},
		{"4xx never ejects", []Outcome{OutcomeOf(400), OutcomeOf(404), OutcomeOf(422), OutcomeOf(400)}, true},
		{"isolated 429 and 503 do not eject", []Outcome{OutcomeOf(429), OutcomeOK, OutcomeOf(503), OutcomeOK, OutcomeOf(429)}, true},
		{"10 backpressure in a row eject", repeat(OutcomeOf(503), 10), false},
		{"2 server errors do not eject", []Outcome{OutcomeOf(500), OutcomeOf(502)}, true},
		{"3 server errors in a row eject", []Outcome{OutcomeOf(500), OutcomeOf(502), OutcomeOf(504)}, false},
		{"ok resets the run", []Outcome{OutcomeOf(500), OutcomeOf(500), OutcomeOK, OutcomeOf(500), OutcomeOf(500)}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, reg := newTestFleet(t, Config{Endpoints: twoEndpoints(), ProbeInterval: -1, Now: func() time.Time { return now }})
			a := f.Endpoints("m")[0]
			for _, o := range tt.outcomes {
				f.Report(a, o)
			}
			got, _, err := f.Healthy(nil, "m")
			if err != nil {
				t.Fatal(err)
			}
			if up := len(got) == 2; up != tt.wantUp {
				t.Errorf("healthy = %v, want a up = %v", names(got), tt.wantUp)
			}
			if v := testutil.ToFloat64(f.m.up.WithLabelValues("a:1")); (v == 1) != tt.wantUp {
				t.Errorf("endpoint_up gauge = %v", v)
			}
			_ = reg
		})
	}
}

func repeat(o Outcome, n int) []Outcome {
	out := make([]Outcome, n)
	for i := range out {
		out[i] = o
	}
	return out
}

func TestBackoffWithoutProbes(t *testing.T) {
	now := time.Unix(1000, 0)
	f, _ := newTestFleet(t, Config{Endpoints: twoEndpoints(), ProbeInterval: -1,
		BackoffBase: time.Second, BackoffMax: 4 * time.Second, Now: func() time.Time { return now }})
	a, b := f.Endpoints("m")[0], f.Endpoints("m")[1]
	f.Report(a, OutcomeConnError)
	f.Report(b, OutcomeConnError)
	_, retry, err := f.Healthy(nil, "m")
	if !errors.Is(err, ErrNoEndpoint) || retry != time.Second {
		t.Fatalf("all down: err %v retry %v, want ErrNoEndpoint after 1s", err, retry)
	}
	if f.Ready() {
		t.Error("ready with every endpoint down")
	}
	now = now.Add(time.Second)
	got, _, _ := f.Healthy(nil, "m")
	if len(got) != 2 {
		t.Fatalf("after backoff: %v", names(got))
	}
	// Second ejection without a healthy probe in between: backoff doubled.
	f.Report(a, OutcomeConnError)
	now = now.Add(time.Second)
	if got, _, _ := f.Healthy(nil, "m"); len(got) != 1 {
		t.Fatalf("1s into a 2s backoff: %v", names(got))
	}
	now = now.Add(time.Second)
	if got, _, _ := f.Healthy(nil, "m"); len(got) != 2 {
		t.Fatalf("after 2s backoff: %v", names(got))
	}
	if _, _, err := f.Healthy(nil, "nope"); !errors.Is(err, ErrNoEndpoint) {
		t.Errorf("unknown model: %v", err)
	}
}

// TestProbes runs Run on a virtual clock: a failing probe takes an endpoint
// down, a passive ejection is re-admitted only after its backoff and a good
// probe, probes are jittered per endpoint, and Run returns when ctx ends.
func TestProbes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fe := &fakeEngines{health: map[string]bool{"a:1": true, "b:1": true}, probes: map[string]int{}}
		f, reg := newTestFleet(t, Config{Endpoints: twoEndpoints(), ProbeInterval: 5 * time.Second,
			ScrapeInterval: -1, Client: &http.Client{Transport: fe}})
		a, b := f.Endpoints("m")[0], f.Endpoints("m")[1]
		if f.Ready() {
			t.Fatal("ready before any probe")
		}
		if st := f.States("m"); len(st) != 2 || st[0] != (EndpointState{Name: "a:1", Up: true, Admitted: true}) || st[0].Routable() {
			t.Fatalf("states before any probe: %+v", st)
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error)
		go func() { done <- f.Run(ctx) }()
		synctest.Wait()
		if !f.Ready() {
			t.Fatal("not ready after first probes")
		}
		fe.set("b:1", false)
		time.Sleep(6 * time.Second)
		synctest.Wait()
		if b.Up() || !a.Up() {
			t.Fatalf("after failing probe: a up %v, b up %v", a.Up(), b.Up())
		}
		if st := f.States("m"); !st[0].Routable() || st[1] != (EndpointState{Name: "b:1", Up: false, Probed: true, Admitted: true}) || st[1].Routable() {
			t.Fatalf("states with b failing: %+v", st)
		}
		if !f.Ready() {
			t.Fatal("one of two endpoints down made the model not ready")
		}
		if f.States("nope") != nil {
			t.Fatal("states of an unknown model")
		}
		fe.set("b:1", true)
		time.Sleep(6 * time.Second)
		synctest.Wait()
		if !b.Up() {
			t.Fatal("b not re-admitted after a good probe")
		}
		// Passive ejection: stays down until the backoff has passed AND a probe succeeds.
		f.Report(a, OutcomeConnError)
		if a.Up() {
			t.Fatal("a up after conn error")
		}
		time.Sleep(12 * time.Second)
		synctest.Wait()
		if !a.Up() {
			t.Fatal("a not re-admitted")
		}
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Run returned %v", err)
		}
		fe.mu.Lock()
		pa, pb := fe.probes["a:1/health"], fe.probes["b:1/health"]
		fe.mu.Unlock()
		if pa < 4 || pb < 4 {
			t.Errorf("probes a=%d b=%d over 24s at 5s, want >= 4", pa, pb)
		}
		if n := testutil.ToFloat64(f.m.ejections.WithLabelValues("b:1", "probe")); n != 1 {
			t.Errorf("probe ejections of b = %v", n)
		}
		_ = reg
	})
}

func TestJitterDiffersPerEndpoint(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		times := map[string][]time.Duration{}
		start := time.Now()
		rt := rtFunc(func(r *http.Request) (*http.Response, error) {
			mu.Lock()
			times[r.URL.Host] = append(times[r.URL.Host], time.Since(start))
			mu.Unlock()
			return &http.Response{StatusCode: 200, Body: io.NopCloser(strings.NewReader("")), Request: r}, nil
		})
		f, _ := newTestFleet(t, Config{Endpoints: twoEndpoints(), ProbeInterval: 10 * time.Second, ModelsInterval: -1,
			ScrapeInterval: -1, Client: &http.Client{Transport: rt}})
		ctx, cancel := context.WithTimeout(t.Context(), 35*time.Second)
		defer cancel()
		_ = f.Run(ctx)
		ta, tb := times["a:1"], times["b:1"]
		if len(ta) < 3 || len(tb) < 3 {
			t.Fatalf("probes %v %v", ta, tb)
		}
		if ta[1] == tb[1] {
			t.Errorf("second probes at the same instant %v", ta[1])
		}
		for _, ts := range [][]time.Duration{ta, tb} {
			for i := 1; i < len(ts); i++ {
				if d := ts[i] - ts[i-1]; d < 9*time.Second || d > 11*time.Second {
					t.Errorf("interval %v outside 10s ±10%%", d)
				}
			}
		}
	})
}

type rtFunc func(*http.Request) (*http.Response, error)

func (f rtFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestListModels uses real loopback servers: one answers, one is closed, one
// returns garbage; the union holds the good one's models, deduplicated.
func TestListModels(t *testing.T) {
	var hits atomic.Int32
	good := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		if r.Header.Get("Authorization") != "Bearer k1" {
			w.WriteHeader(401)
			return
		}
		io.WriteString(w, `{"object":"list","data":[{"id":"m","object":"model","max_model_len":4096},{"id":"lora1","object":"model"},{"id":"m"},"junk"]}`)
	}))
	defer good.Close()
	bad := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "not json") }))
	defer bad.Close()
	dead := httptest.NewServer(http.NotFoundHandler())
	deadURL := dead.URL
	dead.Close()
	f, _ := newTestFleet(t, Config{Endpoints: []EndpointConfig{
		{URL: deadURL, Models: []string{"m"}},
		{URL: good.URL, Models: []string{"m"}, APIKey: "k1"},
		{URL: bad.URL, Models: []string{"m"}},
	}})
	cards, errs := f.ListModels(t.Context())
	var ids []string
	for _, c := range cards {
		var v struct{ ID string }
		if err := json.Unmarshal(c, &v); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, v.ID)
	}
	if strings.Join(ids, ",") != "m,lora1" {
		t.Errorf("ids %v, want m,lora1", ids)
	}
	if len(errs) != 2 {
		t.Errorf("errs %v, want 2", errs)
	}
	f.cfg.Client.CloseIdleConnections()
}

func FuzzDecodeModelList(f *testing.F) {
	f.Add([]byte(`{"object":"list","data":[{"id":"Qwen/Qwen3-0.6B","object":"model","created":1,"owned_by":"vllm","max_model_len":40960}]}`))
	f.Add([]byte(`{"data":[1,"x",null,{}]}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		cards, err := decodeModelList(strings.NewReader(string(b)))
		if err != nil {
			return
		}
		for _, c := range cards {
			if !json.Valid(c) || c[0] != '{' {
				t.Fatalf("card %q", c)
			}
		}
	})
}

func TestScrape(t *testing.T) {
	metrics := "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 3\n" +
		"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine=\"0\",model_name=\"m\"} 5\n" +
		"# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{block_size=\"32\",num_gpu_blocks=\"1000\",prefix_caching_hash_algo=\"sha256\"} 1\n"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			io.WriteString(w, metrics)
		}
	}))
	defer srv.Close()
	got := make(chan enginemetrics.Metrics, 1)
	f, _ := newTestFleet(t, Config{Endpoints: []EndpointConfig{{URL: srv.URL, Models: []string{"m"}}},
		ProbeInterval: -1, ScrapeInterval: time.Hour,
		OnMetrics: func(ep *Endpoint, m enginemetrics.Metrics) {
			select {
			case got <- m:
			default:
			}
		}})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error)
	go func() { done <- f.Run(ctx) }()
	m := <-got
	cancel()
	<-done
	f.cfg.Client.CloseIdleConnections()
	if m.Waiting != 3 || m.Running != 5 || m.BlockSize != 32 || m.NumGPUBlocks != 1000 {
		t.Errorf("scraped %+v", m)
	}
}

// TestScrapeRestart: a monotonic counter that goes backwards between two
// scrapes (100 -> 5, what a restarted vLLM shows) is one engine restart:
// OnRestart once, kvrouter_fleet_engine_restarts_total 1; growth, a first
// scrape and a scrape without the counter are not.
func TestScrapeRestart(t *testing.T) {
	var queries atomic.Pointer[string]
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{engine=\"0\"} 0\n")
		if q := queries.Load(); q != nil {
			io.WriteString(w, "# TYPE vllm:prefix_cache_queries_total counter\nvllm:prefix_cache_queries_total{engine=\"0\"} "+*q+"\n")
		}
	}))
	defer srv.Close()
	var restarts []string
	f, _ := newTestFleet(t, Config{Endpoints: []EndpointConfig{{Name: "e0", URL: srv.URL, Models: []string{"m"}}},
		ProbeInterval: -1, ScrapeInterval: -1,
		OnRestart: func(ep *Endpoint) { restarts = append(restarts, ep.Name()) }})
	defer f.cfg.Client.CloseIdleConnections()
	ep := f.Endpoint("e0")
	for i, step := range []struct {
		queries string // "" = counter absent
		want    int    // restarts so far
	}{
		{"100", 0}, {"150", 0}, {"5", 1}, {"", 1}, {"6", 1}, {"6", 1}, {"0", 2},
	} {
		if step.queries == "" {
			queries.Store(nil)
		} else {
			queries.Store(&step.queries)
		}
		f.scrape(t.Context(), ep)
		if len(restarts) != step.want {
			t.Fatalf("step %d (%s): %d restarts, want %d", i, step.queries, len(restarts), step.want)
		}
	}
	if restarts[0] != "e0" {
		t.Errorf("restart of %q", restarts[0])
	}
	if n := testutil.ToFloat64(f.m.restarts.WithLabelValues("e0")); n != 2 {
		t.Errorf("kvrouter_fleet_engine_restarts_total = %v, want 2", n)
	}
}

// TestRunAndListModelsRecoverPanics: a panic on a probe or list goroutine
// (here from the transport) comes back as an error instead of crashing the
// process, and Run stops its other loops.
func TestRunAndListModelsRecoverPanics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := rtFunc(func(r *http.Request) (*http.Response, error) {
			if r.URL.Host == "b:1" {
				panic("boom")
			}
			return &http.Response{StatusCode: 200, Body: io.NopCloser(strings.NewReader(`{"data":[{"id":"m"}]}`)), Request: r}, nil
		})
		f, _ := newTestFleet(t, Config{Endpoints: twoEndpoints(), ProbeInterval: 5 * time.Second, ModelsInterval: -1,
			ScrapeInterval: -1, Client: &http.Client{Transport: rt}})
		err := f.Run(t.Context())
		if err == nil || errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "probe of b:1 panicked: boom") {
			t.Fatalf("Run = %v, want the probe panic", err)
		}
		cards, errs := f.ListModels(t.Context())
		if len(cards) != 1 || len(errs) != 1 || !strings.Contains(errs[0].Error(), "panicked: boom") {
			t.Fatalf("ListModels = %d cards, errs %v; want 1 card and the panic", len(cards), errs)
		}
	})
}
