package sim

import (
	"slices"
	"testing"
	"time"

	"kvrouter/internal/bench/report"
)

// TestRoutersShareEvents: with three router replicas every replica's index
// is fed every KV event batch (the same entries as the first's at the end),
// the round-robin front spreads requests evenly over them, and the run is
// reproducible from its seed under either front.
func TestRoutersShareEvents(t *testing.T) {
	w := small(t, 40)
	cfg, err := Config{Replicas: 4, Engine: smallEngine, Policies: []string{"kv"}, Seed: 3, Routers: 3}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	f, err := newFleet(cfg, "kv", w, 7)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.simulate(t.Context()); err != nil {
		t.Fatal(err)
	}
	want := f.ix.Stats()
	if want.Entries == 0 || len(f.peers) != 2 {
		t.Fatalf("%d entries, %d peers", want.Entries, len(f.peers))
	}
	routed := []int64{f.router.Stats().Decisions}
	for _, p := range f.peers {
		got := p.ix.Stats()
		if got.Entries != want.Entries || got.Stored != want.Stored || got.Removed != want.Removed || got.Batches != want.Batches {
			t.Fatalf("peer index %+v, first %+v", got, want)
		}
		routed = append(routed, p.router.Stats().Decisions)
	}
	if slices.Max(routed)-slices.Min(routed) > 1 || slices.Min(routed) == 0 {
		t.Fatalf("requests per router replica %v: round-robin front", routed)
	}
	for _, front := range []string{FrontRoundRobin, FrontRandom} {
		c := Config{Replicas: 4, Engine: smallEngine, Policies: []string{"kv", "least_load"}, Seed: 3, Routers: 4, Front: front, EventDelay: 5 * time.Millisecond}
		a, err := Run(t.Context(), c, w)
		if err != nil {
			t.Fatal(err)
		}
		b, err := Run(t.Context(), c, w)
		if err != nil {
			t.Fatal(err)
		}
		for i := range a {
			if !slices.Equal(a[i].Samples, b[i].Samples) {
				t.Fatalf("%s front %s: two runs with one seed differ", a[i].Policy, front)
			}
			s := report.Summarize(a[i], report.SLO{TTFT: time.Second, ITL: 100 * time.Millisecond})
			t.Logf("front %s %s: hit %.3f goodput %.2f", front, a[i].Policy, s.HitRate, s.GoodputRPS)
		}
	}
	if _, err := (Config{Routers: 65}).withDefaults(); err == nil {
		t.Fatal("65 routers accepted")
	}
	if _, err := (Config{Front: "least"}).withDefaults(); err == nil {
		t.Fatal("unknown front accepted")
	}
}
