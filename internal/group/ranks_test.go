package group

import (
	"math/rand/v2"
	"testing"
	"time"

	"kvrouter/internal/routing"
	"kvrouter/internal/vllm/enginemetrics"
)

// TestBackendRanks: an engine with dp_size 2 is two routing candidates.
// Blocks stored by rank 1 are found on rank 1 only, the decision names the
// engine and rank 1 (sent as X-data-parallel-rank), a rank's load counts
// for that rank, and removing the engine removes every rank.
func TestBackendRanks(t *testing.T) {
	b, err := NewBackend(BackendConfig{Model: "m", Replicas: []string{"a", "b"}, Exact: true, Policy: "kv",
		DPSize: map[string]int{"b": 2}, Routing: routing.Config{Rand: rand.New(rand.NewPCG(1, 2))}}, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	prompt := seq(640)
	u := stored(prompt, 16)
	u.Rank, u.Batch.DataParallelRank = 1, 1
	b.Apply(u)
	route := func(dry bool) Decision {
		t.Helper()
		d, err := b.Route(&RouteInput{Tokens: append(prompt, 7), Candidates: []string{"a", "b"}, DryRun: dry})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	d := route(false)
	if d.Replica != "b" || !d.HasDPRank || d.DPRank != 1 || d.CachedTokens != 640 {
		t.Fatalf("decision %+v, want b rank 1 with 640 cached", d)
	}
	// The lease counts on b#dp1: a prompt nobody holds avoids that rank.
	other := seq(2000)[1000:]
	d2, err := b.Route(&RouteInput{Tokens: other, Candidates: []string{"b"}, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if !d2.HasDPRank || d2.DPRank != 0 {
		t.Errorf("cold prompt with rank 1 busy: %+v, want rank 0", d2)
	}
	d.Release()

	// Gauges per rank from the engine label: 1000 requests waiting on
	// rank 1 outweigh its cached prefix.
	b.Observe("b", enginemetrics.Metrics{Running: 1000, PerEngine: map[string]enginemetrics.EngineLoad{"1": {Waiting: 1000}}}, time.Now())
	if d := route(true); d.Replica == "b" && d.DPRank == 1 {
		t.Errorf("rank 1 with 1000 waiting still chosen: %+v", d)
	}

	// A dp_size-1 engine sends no rank.
	d3, err := b.Route(&RouteInput{Tokens: other, Candidates: []string{"a"}, DryRun: true})
	if err != nil || d3.Replica != "a" || d3.HasDPRank {
		t.Fatalf("engine a: %+v %v", d3, err)
	}
	b.RemoveReplica("b")
	if n := b.IndexStats().Entries; n != 0 {
		t.Errorf("b removed: %d entries left", n)
	}
	if d := route(true); d.Replica != "a" || d.HasDPRank {
		t.Errorf("after removing b: %+v", d)
	}
}

func TestSplitReplica(t *testing.T) {
	b, err := NewBackend(BackendConfig{Model: "m", Replicas: []string{"x#dp1", "y"}, DPSize: map[string]int{"y": 3}}, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, engine string
		rank         int
	}{{"y#dp2", "y", 2}, {"y", "y", -1}, {"x#dp1", "x#dp1", -1}, {"y#dpz", "y#dpz", -1}, {"z#dp0", "z#dp0", -1}} {
		if e, r := b.splitReplica(c.name); e != c.engine || r != c.rank {
			t.Errorf("splitReplica(%q) = %q %d, want %q %d", c.name, e, r, c.engine, c.rank)
		}
	}
}
