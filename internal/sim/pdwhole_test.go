package sim

import (
	"context"
	"testing"

	"kvrouter/internal/bench/report"
)

// TestPDSimWholePath: 8,192-token prompts at 0.7 of the fleet's prefill
// capacity over TCP with a 4 + 4 split, default SLO. Aggregated serving
// prefills on all 8 GPUs; with two paths conditional disaggregation can
// prefill only on its 4 decode engines or through a 1.07 s pull, and
// trails (87.9% of aggregated); the third path, the whole request on an
// idle prefill engine, brings it within 5% (95.6%, docs/results/2026-12-01-measurements.md).
func TestPDSimWholePath(t *testing.T) {
	sc, err := BuildScenario("long_prompt", ScenarioOptions{Replicas: 8, Load: 0.7, Requests: 800, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	slo := report.SLO{TTFT: DefaultSLOTTFT, ITL: DefaultSLOITL}
	goodput := func(wholeMaxQueue string) map[string]float64 {
		cfg := Config{Replicas: 8, Seed: 1, SLO: slo, PD: PDConfig{PrefillReplicas: 4}}
		cfg.PD.Rule.Link = "tcp"
		if wholeMaxQueue == "off" {
			cfg.PD.Rule.WholeMaxQueue = -1
		}
		runs, err := Run(context.Background(), cfg, sc.Workload)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]float64{}
		for _, r := range runs {
			res := report.Summarize(r, slo)
			if res.Errors != 0 || res.Requests != 800 {
				t.Fatalf("%s: %+v", r.Policy, res)
			}
			out[r.Policy] = res.GoodputRPS
		}
		return out
	}
	on, off := goodput("default"), goodput("off")
	best := max(on[ArrAggregated], on[ArrDisaggregated])
	t.Logf("aggregated %.2f, disaggregated %.2f, conditional %.2f req/s (two paths: %.2f)", on[ArrAggregated], on[ArrDisaggregated], on[ArrConditional], off[ArrConditional])
	if on[ArrConditional] < 0.95*best {
		t.Errorf("conditional with the whole path: %.2f req/s, below 95%% of %.2f", on[ArrConditional], best)
	}
	if off[ArrConditional] >= 0.95*best {
		t.Errorf("two paths reach %.2f req/s of %.2f: the case no longer needs the whole path", off[ArrConditional], best)
	}
}
