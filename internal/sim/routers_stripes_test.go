package sim

import (
	"slices"
	"testing"

	"kvrouter/internal/bench/report"
)

// TestRoutersStripes: on a slice of the Mooncake trace (bursts of
// requests arriving at the same instant), four kv router replicas told of
// each other (routing routers 4, router_index k: striped tie-breaks and
// stripe slack) keep more of one router's goodput than four that are not,
// and with one router the setting changes nothing.
func TestRoutersStripes(t *testing.T) {
	sc, err := BuildScenario("mooncake", ScenarioOptions{Replicas: 8, Trace: trace(t), Requests: 600, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	run := func(routers int, noStripes bool) *report.Run {
		t.Helper()
		runs, err := Run(t.Context(), Config{Replicas: 8, Policies: []string{"kv"}, Seed: 1, Routers: routers, NoStripes: noStripes}, sc.Workload)
		if err != nil {
			t.Fatal(err)
		}
		return runs[0]
	}
	slo := report.SLO{TTFT: DefaultSLOTTFT, ITL: DefaultSLOITL}
	one, oneOff := run(1, false), run(1, true)
	if !slices.Equal(one.Samples, oneOff.Samples) {
		t.Fatal("one router: the stripe setting changed the run")
	}
	base := report.Summarize(one, slo)
	on, off := report.Summarize(run(4, false), slo), report.Summarize(run(4, true), slo)
	t.Logf("goodput: 1 router %.3f; 4 routers striped %.3f (%.3f), not striped %.3f (%.3f); hit rate %.4f / %.4f / %.4f",
		base.GoodputRPS, on.GoodputRPS, on.GoodputRPS/base.GoodputRPS, off.GoodputRPS, off.GoodputRPS/base.GoodputRPS,
		base.HitRate, on.HitRate, off.HitRate)
	if on.GoodputRPS <= off.GoodputRPS {
		t.Fatalf("4 routers: striped goodput %.3f, not striped %.3f", on.GoodputRPS, off.GoodputRPS)
	}
	if on.HitRate < 0.95*base.HitRate {
		t.Fatalf("4 routers striped: hit rate %.4f, one router's %.4f", on.HitRate, base.HitRate)
	}
}
