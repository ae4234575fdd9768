package routing

import (
	"testing"

	"kvrouter/internal/kvindex"
)

// TestKVAffinityOwnPrefixOnly: the slack keeps a request with the replica
// holding its own history, not with one holding a prefix others hold too,
// nor with one carrying more than twice its share of requests. A
// 3,200-token prompt (200 blocks), prefill 10,000 tok/s, credit decay 2 s:
//
//	holder 190 blocks, 8,000 queued (0.8 s): credit 3040*e^-0.4 = 2038,
//	                                          cost (8000+1162)/10000 = 0.916 s
//	idle, 10 blocks (a shared system prompt): cost (3200-160)/10000 = 0.304 s
//	idle, nothing:                            cost 0.320 s
//
// The holder is within the 2 s slack and holds 180 blocks (2,880 tokens)
// more than the idle ones: it wins (affinity). With a second replica holding
// the same 190 blocks at the same queue, the holder's gain over every other
// candidate is 0: the idle one wins by cost, as without the slack (before
// this rule the holder won: it held more than the cheapest). With 8
// in-flight requests on the holder and 1 on each other (their mean 1, cap
// 2*1+1 = 3) the cheapest wins; with 3, the holder. With two replicas the
// cap still binds: 8 against 3 spreads (cap 7), 7 against 3 stays.
func TestKVAffinityOwnPrefixOnly(t *testing.T) {
	load := func(inFlight, queued int64) Load {
		return Load{InFlight: inFlight, QueuedPrefill: queued, PrefillRate: 10000, DecodeRate: 2000}
	}
	for _, c := range []struct {
		name   string
		cands  []Candidate
		want   string
		reason string
	}{
		{"own history stays", []Candidate{
			{Name: "holder", Match: kvindex.Match{GPU: 190}, Load: load(2, 8000)},
			{Name: "idle", Match: kvindex.Match{GPU: 10}, Load: load(1, 0)},
			{Name: "idle2", Match: kvindex.Match{GPU: 10}, Load: load(1, 0)},
		}, "holder", "affinity"},
		{"a prefix another replica holds spreads", []Candidate{
			{Name: "holder", Match: kvindex.Match{GPU: 190}, Load: load(2, 8000)},
			{Name: "copy", Match: kvindex.Match{GPU: 190}, Load: load(2, 8000)},
			{Name: "idle", Load: load(0, 0)},
		}, "idle", "min_cost"},
		{"a holder over twice its share spreads", []Candidate{
			{Name: "holder", Match: kvindex.Match{GPU: 190}, Load: load(8, 8000)},
			{Name: "idle", Load: load(1, 0)},
			{Name: "idle2", Match: kvindex.Match{GPU: 1}, Load: load(1, 0)},
		}, "idle2", "min_cost"},
		{"a holder within twice its share stays", []Candidate{
			{Name: "holder", Match: kvindex.Match{GPU: 190}, Load: load(3, 8000)},
			{Name: "idle", Load: load(1, 0)},
			{Name: "idle2", Match: kvindex.Match{GPU: 1}, Load: load(1, 0)},
		}, "holder", "affinity"},
	} {
		p, err := NewPolicy("kv", seeded(1))
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range [][]int{{0, 1, 2}, {2, 1, 0}, {1, 2, 0}} {
			cs := []Candidate{c.cands[o[0]], c.cands[o[1]], c.cands[o[2]]}
			for _, d := range []Decision{p.Pick(&Request{PromptTokens: 3200}, cs), p.(Evaluator).Evaluate(&Request{PromptTokens: 3200}, cs)} {
				if d.Name != c.want || d.Reason != c.reason {
					t.Errorf("%s, order %v: %s (%s), want %s (%s); terms %+v", c.name, o, d.Name, d.Reason, c.want, c.reason, d.Terms)
				}
			}
		}
	}
	for _, c := range []struct {
		holder int64
		want   string
	}{{8, "other"}, {7, "holder"}} {
		p, _ := NewPolicy("kv", seeded(1))
		d := p.Pick(&Request{PromptTokens: 3200}, []Candidate{
			{Name: "holder", Match: kvindex.Match{GPU: 190}, Load: load(c.holder, 8000)},
			{Name: "other", Match: kvindex.Match{GPU: 1}, Load: load(3, 0)},
		})
		if d.Name != c.want {
			t.Errorf("two replicas, holder %d in flight, other 3: %s (%s), want %s", c.holder, d.Name, d.Reason, c.want)
		}
	}
	// A negative cap turns the load limit off: the busy holder stays.
	cfg := seeded(1)
	cfg.KV.AffinityLoadCap = -1
	p, _ := NewPolicy("kv", cfg)
	d := p.Pick(&Request{PromptTokens: 3200}, []Candidate{
		{Name: "holder", Match: kvindex.Match{GPU: 190}, Load: load(8, 8000)},
		{Name: "idle", Load: load(0, 0)},
		{Name: "idle2", Load: load(0, 0)},
	})
	if d.Name != "holder" || d.Reason != "affinity" {
		t.Errorf("no load cap: %s (%s), want holder (affinity)", d.Name, d.Reason)
	}
}
