package routing

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"kvrouter/internal/kvindex"
)

// TestKVAffinitySlack: a 3,200-token prompt, prefill 10,000 tok/s, credit
// decay 2 s:
//
//	a idle, nothing cached:                cost 3200/10000             = 0.320 s
//	b 50 blocks, 4,000 queued (0.4 s):     credit 800*e^-0.2 = 655,
//	                                       cost (4000+2545)/10000      = 0.655 s
//	c 150 blocks, 8,000 queued (0.8 s):    credit 2400*e^-0.4 = 1609,
//	                                       cost (8000+1591)/10000      = 0.959 s
//
// c holds 100 blocks (1,600 tokens, half the prompt) more than any other
// candidate. Without slack (negative) a wins; with 0.5 s too (c is not
// within 0.820 s, and only the candidate holding the most can win by the
// slack); with 1 s or the default 2 s, c (within 1.320 s). In every
// candidate order.
func TestKVAffinitySlack(t *testing.T) {
	cands := []Candidate{
		{Name: "a", Load: Load{PrefillRate: 10000, DecodeRate: 2000}},
		{Name: "b", Match: kvindex.Match{GPU: 50}, Load: Load{QueuedPrefill: 4000, PrefillRate: 10000, DecodeRate: 2000}},
		{Name: "c", Match: kvindex.Match{GPU: 150}, Load: Load{QueuedPrefill: 8000, PrefillRate: 10000, DecodeRate: 2000}},
	}
	orders := [][]int{{0, 1, 2}, {2, 1, 0}, {1, 2, 0}}
	for _, c := range []struct {
		slack  time.Duration
		want   string
		reason string
	}{{-time.Second, "a", "min_cost"}, {500 * time.Millisecond, "a", "min_cost"}, {0, "c", "affinity"}, {time.Second, "c", "affinity"}} {
		cfg := seeded(1)
		cfg.KV.AffinitySlack = c.slack
		p, err := NewPolicy("kv", cfg)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range orders {
			cs := []Candidate{cands[o[0]], cands[o[1]], cands[o[2]]}
			for _, d := range []Decision{p.Pick(&Request{PromptTokens: 3200}, cs), p.(Evaluator).Evaluate(&Request{PromptTokens: 3200}, cs)} {
				if d.Name != c.want || d.Reason != c.reason {
					t.Errorf("slack %v, order %v: %s (%s), want %s (%s); terms %+v", c.slack, o, d.Name, d.Reason, c.want, c.reason, d.Terms)
				}
			}
		}
	}
	// Equal overlaps within the slack: the slack changes nothing, the
	// cheaper wins as without it.
	cfg := seeded(1)
	cfg.KV.AffinitySlack = time.Second
	p, _ := NewPolicy("kv", cfg)
	d := p.Pick(&Request{PromptTokens: 3200}, []Candidate{
		{Name: "busy", Match: kvindex.Match{GPU: 100}, Load: Load{QueuedPrefill: 4000, PrefillRate: 10000, DecodeRate: 2000}},
		{Name: "idle", Match: kvindex.Match{GPU: 100}, Load: Load{PrefillRate: 10000, DecodeRate: 2000}},
	})
	if d.Name != "idle" || d.Reason != "min_cost" {
		t.Errorf("equal overlaps: %s (%s)", d.Name, d.Reason)
	}
	// Less than half the prompt more (99 blocks, 1,584 of 3,200 tokens):
	// not a continuation, the cheapest wins.
	d = p.Pick(&Request{PromptTokens: 3200}, []Candidate{
		{Name: "busy", Match: kvindex.Match{GPU: 99}, Load: Load{QueuedPrefill: 4000, PrefillRate: 10000, DecodeRate: 2000}},
		{Name: "idle", Load: Load{PrefillRate: 10000, DecodeRate: 2000}},
	})
	if d.Name != "idle" || d.Reason != "min_cost" {
		t.Errorf("short overlap: %s (%s)", d.Name, d.Reason)
	}
}

// TestKVAffinityProperty: with the default slack (2 s), kv's pick costs at
// most 2 s more than the cheapest candidate, holds at least as much as
// every cheapest one, and when it is not the cheapest holds at least half
// the prompt more than every other candidate does.
func TestKVAffinityProperty(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	p, _ := NewPolicy("kv", seeded(1))
	moved := 0
	for trial := range 2000 {
		cands := make([]Candidate, 1+rng.IntN(8))
		for i := range cands {
			cands[i] = Candidate{Name: fmt.Sprint("r", i), Match: kvindex.Match{GPU: int32(rng.IntN(200))},
				Load: Load{QueuedPrefill: int64(rng.IntN(30) * 1000), PrefillRate: 10000, DecodeRate: 2000}}
		}
		d := p.Pick(&Request{PromptTokens: 3200}, cands)
		minCost, atMin := d.Terms[0].Cost, 0.0
		for _, tm := range d.Terms {
			minCost = min(minCost, tm.Cost)
		}
		for _, tm := range d.Terms {
			if tied(tm.Cost, minCost) {
				atMin = max(atMin, tm.Overlap)
			}
		}
		c := d.Chosen()
		if c.Cost > minCost+2+1e-9 || c.Overlap < atMin {
			t.Fatalf("trial %d: chose cost %v overlap %v; cheapest %v holds %v", trial, c.Cost, c.Overlap, minCost, atMin)
		}
		if !tied(c.Cost, minCost) {
			moved++
			others := 0.0
			for i, tm := range d.Terms {
				if i != d.Index {
					others = max(others, tm.Overlap)
				}
			}
			if (c.Overlap-others)*bs < 1600 || d.Reason != "affinity" {
				t.Fatalf("trial %d: %s pick holds %v blocks, the others at most %v", trial, d.Reason, c.Overlap, others)
			}
		}
	}
	if moved == 0 {
		t.Error("the slack never moved a pick")
	}
}
