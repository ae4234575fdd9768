package sim

import (
	"strconv"
	"strings"
	"testing"

	"kvrouter/internal/bench/report"
)

// TestAdapterMix: with each adapter on 2 of 8 replicas, every adapter
// request of every policy lands on a replica with its adapter; the kv
// policy's hit rate beats round_robin's; the oracle is refused.
func TestAdapterMix(t *testing.T) {
	w := small(t, 40)
	assignAdapters(w, 4)
	cfg := Config{Replicas: 8, Engine: smallEngine, Policies: []string{"round_robin", "kv"}, Seed: 9, AdapterReplicas: 2}
	runs, err := Run(t.Context(), cfg, w)
	if err != nil {
		t.Fatal(err)
	}
	f := &fleet{cfg: cfg}
	adapters := 0
	for _, run := range runs {
		for i, s := range run.Samples {
			r := &w.Requests[i]
			if r.LoRA == "" || s.Err != "" {
				continue
			}
			adapters++
			rep, err := strconv.Atoi(strings.TrimPrefix(s.Replica, "r"))
			if err != nil {
				t.Fatalf("replica name %q", s.Replica)
			}
			if !f.servesAdapter(rep, r.LoRA) {
				t.Fatalf("%s: %s request on %s, which lacks it", run.Policy, r.LoRA, s.Replica)
			}
		}
	}
	if adapters == 0 {
		t.Fatal("no adapter requests")
	}
	// Run.EngineHitRate is NaN in the simulator (no engine /metrics): the
	// hit rate is the samples' cached over prompt tokens.
	hit := func(i int) float64 { return report.Summarize(runs[i], report.SLO{TTFT: 2e9, ITL: 1e8}).HitRate }
	if hit(1) <= hit(0) {
		t.Errorf("kv hit rate %.3f not above round_robin's %.3f", hit(1), hit(0))
	}
	cfg.Policies = []string{PolicyOracle}
	if _, err := Run(t.Context(), cfg, w); err == nil {
		t.Error("oracle with adapters: want an error")
	}
}
