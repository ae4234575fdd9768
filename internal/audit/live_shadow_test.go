package audit

import (
	"context"
	"math"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"

	"kvrouter/internal/frontmetrics"
	"kvrouter/internal/promtest"
)

// TestAuditShadowFrontLive: a real Prometheus scrapes two engine-sim
// fleets (models m and n) and two kvrouter expositions. The first is
// kvrouter as it registers its series now (package frontmetrics): model m
// in shadow mode on both fronts, each tick the HTTP front a 100-token
// prompt the shadow policy would have found 50 of cached, the endpoint
// picker (front="epp") a 300-token prompt with 60 of them: the shadow hit
// rate is both fronts' shadow cached tokens over both fronts' prompt
// tokens, 110/400. The second has the shape of a kvrouter from before the
// shadow series had a front label, when only the HTTP front recorded them:
// model n, HTTP 100 tokens with 50, EPP 300-token prompts and no shadow
// decision, which must not be counted in (0.5, not 50/400). The third
// has the shape of a kvrouter from before the front label (the HTTP front
// alone): model o, 200-token prompts with 50 (0.25).
func TestAuditShadowFrontLive(t *testing.T) {
	promtest.Tool(t, "prometheus")
	fm, fn, fo := startFleet(t, "m", 2, 4096), startFleet(t, "n", 2, 4096), startFleet(t, "o", 1, 4096)
	var mu sync.Mutex // a scrape sees every series of a tick or none
	exposition := func(reg *prometheus.Registry) string {
		gather := prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
			mu.Lock()
			defer mu.Unlock()
			return reg.Gather()
		})
		srv := httptest.NewServer(promhttp.HandlerFor(gather, promhttp.HandlerOpts{}))
		t.Cleanup(srv.Close)
		return strings.TrimPrefix(srv.URL, "http://")
	}
	now := prometheus.NewRegistry()
	fs, err := frontmetrics.New(now)
	if err != nil {
		t.Fatal(err)
	}
	nowHTTP, nowEPP := fs.Front(frontmetrics.HTTP), fs.Front(frontmetrics.EPP)
	nowHTTP.InitShadow("m")
	nowEPP.InitShadow("m")
	before := prometheus.NewRegistry()
	oldShadow := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "kvrouter_proxy_shadow_cached_tokens", Help: "as the proxy registered it before the front label", Buckets: prometheus.ExponentialBuckets(16, 4, 9),
	}, []string{"model"})
	oldPrompt := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "kvrouter_proxy_prompt_tokens", Help: "by front", Buckets: prometheus.ExponentialBuckets(16, 4, 9),
	}, []string{"front", "model"})
	before.MustRegister(oldShadow, oldPrompt)
	oldest := prometheus.NewRegistry()
	oldestShadow := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "kvrouter_proxy_shadow_cached_tokens", Help: "without a front label", Buckets: prometheus.ExponentialBuckets(16, 4, 9),
	}, []string{"model"})
	oldestPrompt := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "kvrouter_proxy_prompt_tokens", Help: "without a front label", Buckets: prometheus.ExponentialBuckets(16, 4, 9),
	}, []string{"model"})
	oldest.MustRegister(oldestShadow, oldestPrompt)
	tick := func() {
		mu.Lock()
		defer mu.Unlock()
		nowHTTP.PromptTokens.WithLabelValues("m").Observe(100)
		nowHTTP.ObserveShadow("m", true, 50)
		nowEPP.PromptTokens.WithLabelValues("m").Observe(300)
		nowEPP.ObserveShadow("m", false, 60)
		oldPrompt.WithLabelValues(frontmetrics.HTTP, "n").Observe(100)
		oldShadow.WithLabelValues("n").Observe(50)
		oldPrompt.WithLabelValues(frontmetrics.EPP, "n").Observe(300)
		oldestPrompt.WithLabelValues("o").Observe(200)
		oldestShadow.WithLabelValues("o").Observe(50)
	}
	prom := promtest.Start(t, time.Second, []promtest.Job{
		{Name: "vllm", Targets: slices.Concat(fm.targets(), fn.targets(), fo.targets())},
		{Name: "kvrouter", Targets: []string{exposition(now), exposition(before), exposition(oldest)}},
	})
	prom.WaitTargetsUp(t, len(fm.urls)+len(fn.urls)+len(fo.urls)+3, 30*time.Second)
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	traffic(ctx, t, &wg, fm, "shared", 1)
	traffic(ctx, t, &wg, fn, "shared", 1)
	traffic(ctx, t, &wg, fo, "shared", 1)
	start := time.Now()
	for time.Since(start) < 6*time.Second {
		tick()
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(2500 * time.Millisecond) // two more scrapes of the last ticks
	stop()
	wg.Wait()
	r, err := FromPrometheus(context.Background(), PromConfig{URL: prom.URL, Window: time.Since(start)})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{"m": 110.0 / 400, "n": 0.5, "o": 0.25}
	if len(r.Models) != len(want) {
		t.Fatalf("models %+v, want m, n and o", r.Models)
	}
	for _, m := range r.Models {
		s := m.Shadow
		if s == nil {
			t.Errorf("model %s: no shadow data", m.Model)
			continue
		}
		t.Logf("%s: shadow %.0f of %.0f prompt tokens, hit rate %.4f", m.Model, s.CachedTokens, s.PromptTokens, s.HitRate)
		// A target's series move in the same scrapes, so increase()
		// extrapolates them alike and the ratio is exact.
		if math.Abs(s.HitRate-want[m.Model]) > 1e-9 || s.PromptTokens < 100 {
			t.Errorf("model %s: shadow hit rate %v over %v prompt tokens, want %v (the prompts of the fronts that record shadow decisions)", m.Model, s.HitRate, s.PromptTokens, want[m.Model])
		}
	}
}
