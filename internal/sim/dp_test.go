package sim

import (
	"strings"
	"testing"

	"kvrouter/internal/bench/report"
	"kvrouter/internal/enginesim"
)

// TestDPBalancer: vLLM's rank choice is the lowest waiting*4 + running,
// the first from rank 0, and a pick counts as one more waiting until the
// next refresh, so a burst alternates between idle ranks; after the
// refresh interval the ranks' real counts are read again.
func TestDPBalancer(t *testing.T) {
	f := &fleet{}
	for range 2 {
		c, err := enginesim.NewCore(smallEngine)
		if err != nil {
			t.Fatal(err)
		}
		f.reps = append(f.reps, &replica{core: c})
	}
	b := &dpBalancer{at: -1, counts: make([][2]int, 2)}
	var got []int
	for range 3 {
		got = append(got, b.pick(f, 0))
	}
	if got[0] != 0 || got[1] != 1 || got[2] != 0 {
		t.Fatalf("burst on idle ranks: %v, want 0 1 0", got)
	}
	f.now = dpStatsInterval // refreshed: both idle again
	if r := b.pick(f, 0); r != 0 || b.counts[0][0] != 1 || b.counts[1][0] != 0 {
		t.Fatalf("after refresh: rank %d, counts %v", r, b.counts)
	}
}

// TestDPFleet: 4 engines of 2 ranks each. Requests land on ranks (named
// r0N#dpR) under every policy, all 8 ranks serve, and kv's hit rate with
// ranks as candidates beats kv routing to engines with vLLM choosing the
// rank, which beats round_robin.
func TestDPFleet(t *testing.T) {
	w := small(t, 40)
	cfg := Config{Replicas: 4, DPSize: 2, Engine: smallEngine, Policies: []string{"round_robin", "kv"}, Seed: 9}
	aware, err := Run(t.Context(), cfg, w)
	if err != nil {
		t.Fatal(err)
	}
	cfg.DPRankBlind = true
	blind, err := Run(t.Context(), cfg, w)
	if err != nil {
		t.Fatal(err)
	}
	for _, runs := range [][]*report.Run{aware, blind} {
		for _, run := range runs {
			used := map[string]bool{}
			for _, s := range run.Samples {
				if s.Err != "" {
					t.Fatalf("%s: sample error %s", run.Policy, s.Err)
				}
				if !strings.Contains(s.Replica, "#dp") {
					t.Fatalf("%s: served by %q, not a rank", run.Policy, s.Replica)
				}
				used[s.Replica] = true
			}
			if len(used) != 8 || len(run.Replicas) != 8 {
				t.Errorf("%s: %d ranks served of %d", run.Policy, len(used), len(run.Replicas))
			}
		}
	}
	hit := func(r *report.Run) float64 { return report.Summarize(r, report.SLO{TTFT: 2e9, ITL: 1e8}).HitRate }
	t.Logf("hit rate: round_robin %.3f (blind %.3f), kv ranks %.3f, kv engines %.3f",
		hit(aware[0]), hit(blind[0]), hit(aware[1]), hit(blind[1]))
	if !(hit(aware[1]) > hit(blind[1]) && hit(blind[1]) > hit(blind[0])) {
		t.Errorf("hit rate: kv ranks %.3f, kv engines %.3f, round_robin %.3f: want that order",
			hit(aware[1]), hit(blind[1]), hit(blind[0]))
	}
	if _, err := (Config{Replicas: 2, DPRankBlind: true}).withDefaults(); err == nil {
		t.Error("rank-blind without ranks: want an error")
	}
	if _, err := (Config{Replicas: 2, DPSize: 2, AdapterReplicas: 1}).withDefaults(); err == nil {
		t.Error("ranks with adapter replicas: want an error")
	}
}
