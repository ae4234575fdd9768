package audit

import (
	"context"
	"math"
	"net/http/httptest"
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

// TestAuditShadowFrontLive: a real Prometheus scrapes an engine-sim fleet
// of model m and a kvrouter exposition with both fronts' prompt token
// series (package frontmetrics, the definition kvrouter registers) and the
// shadow series. Only the HTTP front records shadow decisions, so the
// shadow hit rate is the shadow cached tokens over the HTTP front's prompt
// tokens: each tick the HTTP front sees a 100-token prompt the shadow
// policy would have found 50 of cached, while the endpoint picker
// (front="epp") sees 300-token prompts, which must not change the figure
// (with them summed in it would be 50/400).
func TestAuditShadowFrontLive(t *testing.T) {
	promtest.Tool(t, "prometheus")
	f := startFleet(t, "m", 2, 4096)
	reg := prometheus.NewRegistry()
	fs, err := frontmetrics.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	shadow := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "kvrouter_proxy_shadow_cached_tokens", Help: "as proxy registers it", Buckets: prometheus.ExponentialBuckets(16, 4, 9),
	}, []string{"model"})
	reg.MustRegister(shadow)
	httpFront, eppFront := fs.Front(frontmetrics.HTTP), fs.Front(frontmetrics.EPP)
	var mu sync.Mutex // a scrape sees every series of a tick or none
	tick := func() {
		mu.Lock()
		defer mu.Unlock()
		httpFront.PromptTokens.WithLabelValues("m").Observe(100)
		shadow.WithLabelValues("m").Observe(50)
		eppFront.PromptTokens.WithLabelValues("m").Observe(300)
	}
	gather := prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		mu.Lock()
		defer mu.Unlock()
		return reg.Gather()
	})
	kv := httptest.NewServer(promhttp.HandlerFor(gather, promhttp.HandlerOpts{}))
	t.Cleanup(kv.Close)
	prom := promtest.Start(t, time.Second, []promtest.Job{
		{Name: "vllm", Targets: f.targets()},
		{Name: "kvrouter", Targets: []string{strings.TrimPrefix(kv.URL, "http://")}},
	})
	prom.WaitTargetsUp(t, len(f.urls)+1, 30*time.Second)
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	traffic(ctx, t, &wg, f, "shared", 1)
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
	if len(r.Models) != 1 || r.Models[0].Shadow == nil {
		t.Fatalf("want model m with shadow data: %+v", r.Models)
	}
	s := r.Models[0].Shadow
	t.Logf("shadow: %.0f of %.0f prompt tokens, hit rate %.4f", s.CachedTokens, s.PromptTokens, s.HitRate)
	// Both series move in the same scrapes, so increase() extrapolates
	// them alike and the ratio is exact.
	if math.Abs(s.HitRate-0.5) > 1e-9 || s.PromptTokens < 100 {
		t.Errorf("shadow hit rate %v over %v prompt tokens, want 0.5 (the HTTP front's prompts only)", s.HitRate, s.PromptTokens)
	}
}
