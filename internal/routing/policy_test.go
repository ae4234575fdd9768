package routing

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"kvrouter/internal/kvindex"
)

func seeded(seed uint64) Config { return Config{Rand: rand.New(rand.NewPCG(seed, 99))} }

// Property: for random candidates, every cost-based policy picks a candidate
// of minimum cost, and among identical candidates the picks spread.
func TestPickIsMinimumAndTiesSpread(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, name := range []string{"kv", "least_load", "dynamo", "llmd"} {
		cfg := seeded(1)
		cfg.KV.AffinitySlack = -1 // the slack's own property: TestKVAffinityProperty
		p, err := NewPolicy(name, cfg)
		if err != nil {
			t.Fatal(err)
		}
		for trial := range 500 {
			n := 1 + rng.IntN(8)
			cands := make([]Candidate, n)
			for i := range cands {
				cands[i] = Candidate{Name: fmt.Sprint("r", i), Match: kvindex.Match{GPU: int32(rng.IntN(50)), CPU: int32(rng.IntN(5))},
					Load: Load{InFlight: int64(rng.IntN(5)), QueuedPrefill: int64(rng.IntN(3) * 1000), Waiting: rng.IntN(3), Fresh: true,
						KVUsage: rng.Float64(), PrefillRate: 10000, DecodeRate: 2000, RunningDecode: int64(rng.IntN(2) * 500)}}
			}
			d := p.Pick(&Request{PromptTokens: 1000}, cands)
			for i, tm := range d.Terms {
				if tm.Cost < d.Chosen().Cost && !tied(tm.Cost, d.Chosen().Cost) {
					t.Fatalf("%s trial %d: picked %d cost %v but %d costs %v", name, trial, d.Index, d.Chosen().Cost, i, tm.Cost)
				}
			}
		}
		same := make([]Candidate, 4)
		for i := range same {
			same[i] = Candidate{Name: fmt.Sprint("r", i), Load: Load{PrefillRate: 10000, DecodeRate: 2000}}
		}
		count := make([]int, 4)
		for range 4000 {
			count[p.Pick(&Request{PromptTokens: 100}, same).Index]++
		}
		for i, c := range count {
			if c < 800 {
				t.Fatalf("%s: ties do not spread: %v (candidate %d)", name, count, i)
			}
		}
	}
}

func TestTieGoesToLowerLoad(t *testing.T) {
	p, _ := NewPolicy("random", seeded(1))
	_ = p
	d := newDecision("t", []Candidate{{Name: "a", Load: Load{InFlight: 2}}, {Name: "b", Load: Load{InFlight: 1}}, {Name: "c", Load: Load{InFlight: 2}}})
	got := pickMin(&d, []Candidate{{Name: "a", Load: Load{InFlight: 2}}, {Name: "b", Load: Load{InFlight: 1}}, {Name: "c", Load: Load{InFlight: 2}}}, &lockedRand{r: rand.New(rand.NewPCG(1, 1))})
	if got.Name != "b" || got.Reason != "tie_load" {
		t.Fatalf("tie: %s %s", got.Name, got.Reason)
	}
}

func TestKVTermsRecordWhy(t *testing.T) {
	p, _ := NewPolicy("kv", seeded(1))
	d := p.Pick(&Request{PromptTokens: 1600}, []Candidate{
		{Name: "a", Match: kvindex.Match{GPU: 50, CPU: 20}, Load: Load{PrefillRate: 10000, DecodeRate: 2000}},
		{Name: "b", Load: Load{QueuedPrefill: 20000, PrefillRate: 10000, DecodeRate: 2000}},
	})
	a, b := d.Terms[0], d.Terms[1]
	if a.CachedBlocks != 70 || a.Overlap != 65 || a.Credit != 65*16 || a.NewTokens != 1600-65*16 {
		t.Fatalf("a terms %+v", a)
	}
	if math.Abs(a.Cost-a.NewTokens/10000) > 1e-12 || math.Abs(b.Cost-(20000+1600)/10000.0) > 1e-12 {
		t.Fatalf("costs %v %v", a.Cost, b.Cost)
	}
	// Decay: the same overlap on a replica 2s busier than the idlest
	// earns e^-1 of the credit.
	d = p.Pick(&Request{PromptTokens: 1600}, []Candidate{
		{Name: "busy", Match: kvindex.Match{GPU: 100}, Load: Load{QueuedPrefill: 20000, PrefillRate: 10000, DecodeRate: 2000}},
		{Name: "idle", Load: Load{PrefillRate: 10000, DecodeRate: 2000}},
	})
	if got := d.Terms[0].Credit; math.Abs(got-1600*math.Exp(-1)) > 1e-9 {
		t.Fatalf("decayed credit %v", got)
	}
}

func TestDynamoCost(t *testing.T) {
	p, _ := NewPolicy("dynamo", seeded(1))
	d := p.Pick(&Request{PromptTokens: 100}, []Candidate{
		{Name: "a", Match: kvindex.Match{GPU: 3}, Load: Load{QueuedPrefill: 32, ActiveTokens: 160}},
		{Name: "b"},
	})
	// a: prefill (32 + 100-48)/16 = 5.25, decode 160/16 + (7-3) = 14 -> 19.25
	// b: prefill 100/16 = 6.25, decode 7 -> 13.25
	if d.Terms[0].Cost != 19.25 || d.Terms[1].Cost != 13.25 || d.Name != "b" {
		t.Fatalf("dynamo terms %+v", d.Terms)
	}
}

func TestLLMDScore(t *testing.T) {
	p, _ := NewPolicy("llmd", seeded(1))
	d := p.Pick(&Request{PromptTokens: 160}, []Candidate{
		{Name: "a", Match: kvindex.Match{GPU: 10}, Load: Load{Waiting: 4, KVUsage: 0.5, Fresh: true}},
		{Name: "b", Load: Load{Waiting: 0, KVUsage: 0, Fresh: true}},
	})
	// a: 2*0 + 2*0.5 + 3*1 = 4; b: 2*1 + 2*1 + 0 = 4: a tie, lower load wins (both 0 in flight: random).
	if d.Terms[0].Cost != -4 || d.Terms[1].Cost != -4 {
		t.Fatalf("llmd terms %+v", d.Terms)
	}
}

func TestSGLangBranches(t *testing.T) {
	p, _ := NewPolicy("sglang", seeded(1))
	cands := []Candidate{
		{Name: "match", Match: kvindex.Match{GPU: 10}, Held: 900, Load: Load{InFlight: 100}},
		{Name: "small", Held: 10, Load: Load{InFlight: 0}},
		{Name: "big", Held: 1000, Load: Load{InFlight: 1}},
	}
	if d := p.Pick(&Request{PromptTokens: 200}, cands); d.Name != "small" || d.Reason != "imbalanced" {
		t.Fatalf("imbalanced: %s %s", d.Name, d.Reason)
	}
	cands[0].Load.InFlight = 2
	if d := p.Pick(&Request{PromptTokens: 200}, cands); d.Name != "match" || d.Reason != "prefix" {
		t.Fatalf("prefix: %s %s", d.Name, d.Reason)
	}
	if d := p.Pick(&Request{PromptTokens: 2000}, cands); d.Name != "small" || d.Reason != "no_match" {
		t.Fatalf("no match (rate 0.08 < 0.3): %s %s", d.Name, d.Reason)
	}
}

func TestSessionRendezvous(t *testing.T) {
	p, _ := NewPolicy("session", seeded(1))
	cands := []Candidate{{Name: "a"}, {Name: "b"}, {Name: "c"}, {Name: "d"}}
	moved, total := 0, 200
	for s := range total {
		key := fmt.Sprint("sess-", s)
		d := p.Pick(&Request{SessionKey: key}, cands)
		// Any order: same choice (several routers agree).
		rev := []Candidate{cands[3], cands[2], cands[1], cands[0]}
		if d2 := p.Pick(&Request{SessionKey: key}, rev); d2.Name != d.Name {
			t.Fatalf("order changed the pin: %s vs %s", d.Name, d2.Name)
		}
		// Remove a replica other than the pin: the pin stays. Remove the
		// pin: it re-pins elsewhere.
		var rest []Candidate
		for _, c := range cands {
			if c.Name != "a" {
				rest = append(rest, c)
			}
		}
		d3 := p.Pick(&Request{SessionKey: key}, rest)
		if d.Name != "a" && d3.Name != d.Name {
			t.Fatalf("removing a moved session %s from %s", key, d.Name)
		}
		if d.Name == "a" {
			moved++
		}
	}
	if moved < total/8 || moved > total/2 {
		t.Fatalf("%d of %d sessions pinned to one of 4 replicas", moved, total)
	}
	if d := p.Pick(&Request{PromptTokens: 10}, cands); d.Policy != "kv" {
		t.Fatalf("no session key: fallback %s", d.Policy)
	}
}

func TestRoundRobinAndRandom(t *testing.T) {
	p, _ := NewPolicy("round_robin", seeded(1))
	cands := []Candidate{{Name: "a"}, {Name: "b"}, {Name: "c"}}
	for i := range 6 {
		if d := p.Pick(&Request{}, cands); d.Index != i%3 {
			t.Fatalf("round robin step %d picked %d", i, d.Index)
		}
	}
	p, _ = NewPolicy("random", seeded(1))
	seen := map[string]bool{}
	for range 100 {
		seen[p.Pick(&Request{}, cands).Name] = true
	}
	if len(seen) != 3 {
		t.Fatalf("random saw %v", seen)
	}
}

func TestPrefixChars(t *testing.T) {
	p, _ := NewPolicy("prefix_chars", seeded(1))
	cands := []Candidate{{Name: "a"}, {Name: "b"}, {Name: "c"}}
	long := string(make([]byte, 300))
	first := p.Pick(&Request{Text: long + "x"}, cands)
	if first.Reason != "no_match" {
		t.Fatalf("first request: %s", first.Reason)
	}
	for range 10 {
		d := p.Pick(&Request{Text: long + "y"}, cands)
		if d.Name != first.Name || d.Reason != "prefix" {
			t.Fatalf("shared 256-char prefix went to %s (%s), want %s", d.Name, d.Reason, first.Name)
		}
	}
	// The matched endpoint gone: any available one.
	var rest []Candidate
	for _, c := range cands {
		if c.Name != first.Name {
			rest = append(rest, c)
		}
	}
	if d := p.Pick(&Request{Text: long}, rest); d.Reason != "no_match" {
		t.Fatalf("gone endpoint still matched: %+v", d)
	}
}

func TestUnknownPolicy(t *testing.T) {
	if _, err := NewPolicy("nope", Config{}); err == nil {
		t.Fatal("want error")
	}
	if _, err := New(Config{Policy: "nope", PrefillRate: -1}, nil, nil, nil); err == nil {
		t.Fatal("want joined errors")
	}
}

func TestLeaseAccounting(t *testing.T) {
	r, err := New(Config{Policy: "least_load"}, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	r.AddReplica("a")
	_, l, err := r.Route(&Request{Tokens: tokens(1, 100), MaxTokens: 50})
	if err != nil {
		t.Fatal(err)
	}
	got, _ := r.Load("a")
	if got.InFlight != 1 || got.QueuedPrefill != 100 || got.ActiveTokens != 150 {
		t.Fatalf("after route: %+v", got)
	}
	l.FirstToken()
	l.FirstToken()
	got, _ = r.Load("a")
	if got.QueuedPrefill != 0 || got.RunningDecode != 50 {
		t.Fatalf("after first token: %+v", got)
	}
	l.Release()
	l.Release()
	l.FirstToken()
	got, _ = r.Load("a")
	if got != (Load{PrefillRate: 10000, DecodeRate: 2000}) {
		t.Fatalf("after release: %+v", got)
	}
	if n := float64(r.Stats().LeaseUnderflow); n != 0 {
		t.Fatalf("underflow %v", n)
	}
	// An accounting bug (counter already at zero) is counted, clamped.
	_, l, _ = r.Route(&Request{Tokens: tokens(1, 10)})
	r.get("a").inFlight.Store(0)
	l.Release()
	if n := float64(r.Stats().LeaseUnderflow); n != 1 {
		t.Fatalf("underflow %v", n)
	}
	if got, _ := r.Load("a"); got.InFlight != 0 {
		t.Fatalf("clamped: %+v", got)
	}
	if s := r.Stats(); s.Decisions != 2 || len(s.Replicas) != 1 || s.Replicas[0].Decisions != 2 || s.PromptTokens != 110 {
		t.Fatalf("stats %+v", s)
	}
}

func TestGaugesStaleness(t *testing.T) {
	c := &clock{}
	r, _ := New(Config{Now: c.Now, GaugeMaxAge: 5e9}, nil, nil, nil)
	r.AddReplica("a")
	r.ObserveGauges("a", Gauges{Waiting: 3, KVUsage: 0.5, At: c.Now()})
	if l, _ := r.Load("a"); !l.Fresh || l.Waiting != 3 {
		t.Fatalf("fresh gauges: %+v", l)
	}
	c.Add(6e9)
	if l, _ := r.Load("a"); l.Fresh || l.Waiting != 0 {
		t.Fatalf("stale gauges: %+v", l)
	}
}

func TestRouteNoReplica(t *testing.T) {
	r, _ := New(Config{}, nil, nil, nil)
	if _, _, err := r.Route(&Request{}); err != ErrNoReplica {
		t.Fatalf("err %v", err)
	}
	r.AddReplica("a")
	r.SetHealthy("a", false)
	if _, _, err := r.Route(&Request{}); err != ErrNoReplica {
		t.Fatalf("unhealthy: err %v", err)
	}
	r.SetHealthy("a", true)
	r.RemoveReplica("a")
	if _, _, err := r.Route(&Request{}); err != ErrNoReplica {
		t.Fatalf("removed: err %v", err)
	}
}
