package sim

import (
	"sync"
	"testing"

	"kvrouter/internal/bench/report"
	"kvrouter/internal/enginesim"
	"kvrouter/internal/routing"
)

// TestLearnedRatesHeterogeneousFleet is the check on a slice of the
// Mooncake trace: half the replicas prefill at 0.4x, and the router's
// prefill rates are known exactly, mis-set (every replica at 2x the fast
// engines' rate) or learned from the engines' counters starting from the
// mis-set value. Learned must come within 3% of known goodput and beat
// mis-set. (Full trace, same setup: known 4.12, learned 4.06, mis-set 3.84
// req/s; docs/results/2026-12-01-measurements.md.)
func TestLearnedRatesHeterogeneousFleet(t *testing.T) {
	if testing.Short() {
		t.Skip("simulates 1,000 Mooncake requests three times")
	}
	timing, _, err := enginesim.Profile(enginesim.ProfileH100)
	if err != nil {
		t.Fatal(err)
	}
	scale := []float64{1, 0.4}
	sc, err := BuildScenario("mooncake", ScenarioOptions{Replicas: 8, Requests: 1000, Trace: trace(t),
		PrefillRate: timing.PrefillTokensPerSec * 0.7, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, rates string
		prefill     float64
	}{
		{"known", RatesKnown, 0},
		{"mis-set", RatesConfigured, 2 * timing.PrefillTokensPerSec},
		{"learned", RatesLearned, 2 * timing.PrefillTokensPerSec},
	}
	results := make([]report.PolicyResult, len(cases))
	errs := make([]error, len(cases))
	var wg sync.WaitGroup
	for i, c := range cases {
		wg.Go(func() {
			cfg := Config{Replicas: sc.Replicas, Policies: []string{"kv"}, PrefillScale: scale, Rates: c.rates,
				Routing: routing.Config{PrefillRate: c.prefill}, Seed: 1, Parallel: 1}
			runs, err := Run(t.Context(), cfg, sc.Workload)
			if err != nil {
				errs[i] = err
				return
			}
			results[i] = report.Summarize(runs[0], report.SLO{TTFT: DefaultSLOTTFT, ITL: DefaultSLOITL})
		})
	}
	wg.Wait()
	goodput := map[string]float64{}
	for i, c := range cases {
		if errs[i] != nil {
			t.Fatalf("%s: %v", c.name, errs[i])
		}
		res := results[i]
		goodput[c.name] = res.GoodputRPS
		t.Logf("%-8s goodput %.3f req/s, hit rate %.3f, TTFT p90 %.0f ms", c.name, res.GoodputRPS, res.HitRate, res.TTFT.P90)
	}
	if goodput["learned"] < 0.97*goodput["known"] {
		t.Errorf("learned goodput %.3f below 0.97 of known %.3f", goodput["learned"], goodput["known"])
	}
	if goodput["learned"] <= goodput["mis-set"] {
		t.Errorf("learned goodput %.3f does not beat mis-set %.3f", goodput["learned"], goodput["mis-set"])
	}
	if goodput["mis-set"] >= goodput["known"] {
		t.Errorf("mis-set rates (%.3f) do not cost goodput against known (%.3f): the check shows nothing", goodput["mis-set"], goodput["known"])
	}
}
