package ui

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"kvrouter/internal/fleet"
	"kvrouter/internal/vllm/enginemetrics"
)

func newTestUI(t *testing.T, key string) (*UI, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	f, err := fleet.New(fleet.Config{Models: []string{"m"}, ProbeInterval: -1, ScrapeInterval: -1}, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"b", "a"} {
		if _, err := f.Add(fleet.EndpointConfig{Name: n, URL: "http://127.0.0.1:1", Models: []string{"m"}}); err != nil {
			t.Fatal(err)
		}
	}
	connected := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kvrouter_vllm_connected"}, []string{"engine", "rank"})
	decisions := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvrouter_routing_decisions_total"}, []string{"model", "policy", "replica"})
	cached := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvrouter_routing_cached_tokens_total"}, []string{"model", "policy"})
	prompt := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvrouter_routing_prompt_tokens_total"}, []string{"model", "policy"})
	lag := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kvrouter_vllm_lag_seconds"}, []string{"engine", "rank"})
	reg.MustRegister(connected, decisions, cached, prompt, lag)
	connected.WithLabelValues("a", "0").Set(1)
	connected.WithLabelValues("b", "0").Set(1)
	connected.WithLabelValues("b", "1").Set(0) // one rank down
	decisions.WithLabelValues("m", "kv", "a").Add(3)
	cached.WithLabelValues("m", "kv").Add(30)
	prompt.WithLabelValues("m", "kv").Add(120)
	lag.WithLabelValues("a", "0").Observe(0.002)
	lag.WithLabelValues("a", "0").Observe(0.004)
	u := New(Config{APIKey: key, Policies: map[string]string{"m": "kv"}}, Deps{Fleet: f, Gatherer: reg,
		Now: func() time.Time { return time.Unix(1700000000, 0) }})
	return u, reg
}

func TestState(t *testing.T) {
	u, _ := newTestUI(t, "")
	u.Observe("a", enginemetrics.Metrics{Running: 2, Waiting: 1, KVCacheUsage: 0.5, PrefixCacheQueries: 100, PrefixCacheHits: 25})
	for i := range Recent + 3 {
		u.Record("m", string(rune('A'+i%26)), "a", i, 100, map[string]int{"i": i})
	}
	st := u.State()
	m := st.Models[0]
	if m.Name != "m" || m.Policy != "kv" || *m.PredictedHitRate != 0.25 || *m.EngineHitRate != 0.25 || m.Decisions["kv"]["a"] != 3 {
		t.Errorf("model %+v", m)
	}
	a, b := m.Engines[0], m.Engines[1]
	if a.Name != "a" || a.Events != "connected" || *a.LagSeconds != 0.003 || *a.Running != 2 || *a.KVUsage != 0.5 || *a.EngineHitRate != 0.25 {
		t.Errorf("engine a %+v", a)
	}
	if b.Name != "b" || b.Events != "disconnected" || b.LagSeconds != nil || b.Running != nil {
		t.Errorf("engine b %+v", b)
	}
	if len(st.Recent) != Recent || st.Recent[0].CachedTokens != Recent+2 || st.Recent[Recent-1].CachedTokens != 3 || string(st.Recent[0].Explain) != `{"i":52}` {
		t.Errorf("recent: %d, newest %+v, oldest %+v", len(st.Recent), st.Recent[0], st.Recent[Recent-1])
	}
}

// TestAuth: with an API key both paths need it, as a bearer token or a
// basic-authentication password; without one they are open.
func TestAuth(t *testing.T) {
	u, _ := newTestUI(t, "s3cret")
	srv := httptest.NewServer(u.Handler())
	defer srv.Close()
	get := func(path, auth string) int {
		req, _ := http.NewRequest("GET", srv.URL+path, nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, p := range []string{"/ui", "/ui/state"} {
		for auth, want := range map[string]int{"": 401, "Bearer nope": 401, basic("nope"): 401, "Bearer s3cret": 200, basic("s3cret"): 200} {
			if got := get(p, auth); got != want {
				t.Errorf("%s with %q: %d, want %d", p, auth, got, want)
			}
		}
	}
	open, _ := newTestUI(t, "")
	srv2 := httptest.NewServer(open.Handler())
	defer srv2.Close()
	resp, err := http.Get(srv2.URL + "/ui/state")
	if err != nil {
		t.Fatal(err)
	}
	var st State
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil || resp.StatusCode != 200 || len(st.Models) != 1 {
		t.Errorf("open /ui/state: %d %v %+v", resp.StatusCode, err, st)
	}
	resp.Body.Close()
}

// TestPageSelfContained: the page loads nothing from elsewhere.
func TestPageSelfContained(t *testing.T) {
	u, _ := newTestUI(t, "")
	srv := httptest.NewServer(u.Handler())
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/ui")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if ext := regexp.MustCompile(`(src|href)\s*=|https?://|@import|url\(`).FindString(string(body)); ext != "" {
		t.Errorf("page refers outside itself: %q", ext)
	}
	if !strings.Contains(resp.Header.Get("Content-Security-Policy"), "default-src 'self'") {
		t.Errorf("CSP %q", resp.Header.Get("Content-Security-Policy"))
	}
}

// BenchmarkRecord is the /ui's cost on the request path: one decision
// recorded into a full list.
//
//	go test -run '^$' -bench BenchmarkRecord -benchmem ./internal/ui/
func BenchmarkRecord(b *testing.B) {
	u := New(Config{}, Deps{Fleet: nil})
	var explain any = struct{ Policy string }{"kv"} // boxed once, as the proxy hands it over
	for range Recent {
		u.Record("m", "id", "a", 16, 100, explain)
	}
	b.ReportAllocs()
	for b.Loop() {
		u.Record("m", "0123456789abcdef0123456789abcdef", "gpu-a", 608, 617, explain)
	}
}
