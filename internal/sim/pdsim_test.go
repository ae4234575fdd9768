package sim

import (
	"context"
	"testing"

	"kvrouter/internal/bench/report"
)

func pdRun(t *testing.T, scenario string, load float64, requests int, link string) map[string]report.PolicyResult {
	t.Helper()
	sc, err := BuildScenario(scenario, ScenarioOptions{Replicas: 8, Load: load, Requests: requests, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Replicas: 8, Seed: 1, PD: PDConfig{PrefillReplicas: 4}}
	cfg.PD.Rule.Link = link
	runs, err := Run(context.Background(), cfg, sc.Workload)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]report.PolicyResult{}
	for _, r := range runs {
		res := report.Summarize(r, report.SLO{TTFT: DefaultSLOTTFT, ITL: DefaultSLOITL})
		if res.Errors != 0 || res.Requests != requests {
			t.Fatalf("%s: %+v", r.Policy, res)
		}
		out[r.Policy] = res
		t.Logf("%s: TTFT p50 %.0f p99 %.0f ms, ITL p50 %.1f p99 %.1f ms, goodput %.2f req/s", r.Policy, res.TTFT.P50, res.TTFT.P99, res.ITL.P50, res.ITL.P99, res.GoodputRPS)
	}
	return out
}

func TestPDSimLongPrompt(t *testing.T) {
	res := pdRun(t, "long_prompt", 0.6, 400, "infiniband")
	_ = res
}
