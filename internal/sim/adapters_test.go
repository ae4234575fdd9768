package sim

import (
	"strconv"
	"strings"
	"testing"
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
	if runs[1].EngineHitRate <= runs[0].EngineHitRate {
		t.Errorf("kv hit rate %.3f not above round_robin's %.3f", runs[1].EngineHitRate, runs[0].EngineHitRate)
	}
	cfg.Policies = []string{PolicyOracle}
	if _, err := Run(t.Context(), cfg, w); err == nil {
		t.Error("oracle with adapters: want an error")
	}
}
