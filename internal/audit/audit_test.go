package audit

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestVerdicts decides verdicts from counters over a 100 s window.
func TestVerdicts(t *testing.T) {
	c := func(q, h, req, pre float64) Counters {
		return Counters{Queries: q, Hits: h, Requests: req, Preemptions: pre}
	}
	for _, tt := range []struct {
		name   string
		reps   map[string]Counters
		shadow *Shadow
		want   Verdict
		gain   float64
	}{
		{"idle", map[string]Counters{"a": {}, "b": {}}, nil, NoTraffic, 0},
		{"thrashing beats all", map[string]Counters{"a": c(1000, 900, 100, 6), "b": c(1000, 900, 100, 0)}, nil, Thrashing, 0.1},
		{"few preemptions only warn", map[string]Counters{"a": c(1000, 100, 100, 4), "b": c(1000, 100, 100, 0)}, nil, WorthIt, 0.1},
		{"one replica", map[string]Counters{"a": c(1000, 100, 10, 0)}, nil, OneReplica, 0},
		{"already high", map[string]Counters{"a": c(1000, 600, 10, 0), "b": c(1000, 500, 10, 0)}, nil, AlreadyHigh, 0.45},
		{"low: 4 x 2% is 8%", map[string]Counters{"a": c(1000, 20, 10, 0), "b": c(1000, 20, 10, 0), "c": c(1000, 20, 10, 0), "d": c(1000, 20, 10, 0)}, nil, LowReuse, 0.06},
		{"worth it: 4 x 20%", map[string]Counters{"a": c(1000, 200, 10, 0), "b": c(1000, 200, 10, 0), "c": c(1000, 200, 10, 0), "d": c(1000, 200, 10, 0)}, nil, WorthIt, 0.6},
		{"shadow measures a small gain", map[string]Counters{"a": c(1000, 200, 10, 0), "b": c(1000, 200, 10, 0)}, &Shadow{CachedTokens: 250, PromptTokens: 1000}, LowReuse, 0.05},
		{"shadow measures a large gain", map[string]Counters{"a": c(1000, 200, 10, 0), "b": c(1000, 200, 10, 0)}, &Shadow{CachedTokens: 700, PromptTokens: 1000}, WorthIt, 0.5},
	} {
		t.Run(tt.name, func(t *testing.T) {
			sh := map[string]Shadow{}
			if tt.shadow != nil {
				sh["m"] = *tt.shadow
			}
			r := build("test", 100*time.Second, map[string]map[string]Counters{"m": tt.reps}, sh)
			m := r.Models[0]
			if m.Verdict != tt.want || abs(m.EstimatedGain-tt.gain) > 1e-9 {
				t.Errorf("verdict %s gain %.3f, want %s %.3f (%s)", m.Verdict, m.EstimatedGain, tt.want, tt.gain, m.Reason)
			}
			if m.GainMeasured != (tt.shadow != nil) || m.SavedPrefillTokensPerSec != m.EstimatedGain*m.QueryTokensPerSec {
				t.Errorf("measured %v, saved %v", m.GainMeasured, m.SavedPrefillTokensPerSec)
			}
		})
	}
}

func abs(f float64) float64 {
	if f < 0 {
		return -f
	}
	return f
}

func TestParseMetrics(t *testing.T) {
	s, err := parseMetrics(strings.NewReader(oldEngine))
	if err != nil {
		t.Fatal(err)
	}
	if s.model != "old" || s.c.Queries != 1000 || s.c.Hits != 500 || !s.hasUsage || s.usage != 0.25 || len(s.old) != 2 {
		t.Errorf("%+v", s)
	}
	for _, bad := range []string{"vllm:x{", "# TYPE vllm:prefix_cache_queries_total counter\n", "up 1\n"} {
		if _, err := parseMetrics(strings.NewReader(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
	// A restarted engine's counter counts from zero.
	d := scrape{c: Counters{Queries: 30}}.since(scrape{c: Counters{Queries: 1000}})
	if d.c.Queries != 30 {
		t.Errorf("after a restart: %v", d.c.Queries)
	}
}

func FuzzParseMetrics(f *testing.F) {
	f.Add(oldEngine)
	f.Add("vllm:prefix_cache_queries_total{model_name=\"m\"} 5\nvllm:kv_cache_usage_perc NaN\n")
	f.Fuzz(func(t *testing.T, in string) {
		s, err := parseMetrics(strings.NewReader(in))
		if err == nil && s.old == nil {
			t.Fatal("parsed without its map")
		}
	})
}

// TestFromPrometheusErrors: an API error, a non-API answer and no server
// are errors that say what failed.
func TestFromPrometheusErrors(t *testing.T) {
	apiErr := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(400)
		w.Write([]byte(`{"status":"error","errorType":"bad_data","error":"parse error"}`))
	}))
	defer apiErr.Close()
	html := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("<html>")) }))
	defer html.Close()
	for url, want := range map[string]string{apiErr.URL: "bad_data: parse error", html.URL: "not the API's JSON", "http://127.0.0.1:1": "prometheus query", "": "no Prometheus URL"} {
		_, err := FromPrometheus(context.Background(), PromConfig{URL: url})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", url, err, want)
		}
	}
	if _, err := FromEngines(context.Background(), SampleConfig{Engines: []string{html.URL}, Samples: 2, Window: time.Millisecond}); err == nil {
		t.Error("an engine without vLLM metrics: no error")
	}
}
