package routing

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"kvrouter/internal/kvindex"
)

// Policy-level scenarios: candidates given directly, every order tried.
func TestKVScenariosAnyOrder(t *testing.T) {
	busy := Load{InFlight: 20, QueuedPrefill: 60_000, RunningDecode: 4000, PrefillRate: 10000, DecodeRate: 2000}
	idle := Load{PrefillRate: 10000, DecodeRate: 2000}
	tests := []struct {
		name   string
		prompt int
		cands  []Candidate
		want   string
	}{
		{"B+A goes to the replica holding B", 512, []Candidate{
			{Name: "r1", Load: idle},                                // holds A: not a prefix of B+A
			{Name: "r2", Match: kvindex.Match{GPU: 16}, Load: idle}, // holds B
			{Name: "r3", Load: idle},
		}, "r2"},
		{"unique prompt: busy small index loses to idle large index", 8000, []Candidate{
			{Name: "r1", Held: 10, Load: busy},
			{Name: "r2", Held: 100_000, Load: idle},
		}, "r2"},
		{"one hot replica does not switch off prefix routing for an idle best replica", 8000, []Candidate{
			{Name: "hot", Match: kvindex.Match{GPU: 500}, Load: Load{InFlight: 200, QueuedPrefill: 2_000_000, PrefillRate: 10000, DecodeRate: 2000}},
			{Name: "best", Match: kvindex.Match{GPU: 400}, Load: idle},
			{Name: "cold", Load: idle},
		}, "best"},
		{"short prompt under one block goes by load", 10, []Candidate{
			{Name: "r1", Load: Load{InFlight: 3, QueuedPrefill: 30, PrefillRate: 10000, DecodeRate: 2000}},
			{Name: "r2", Load: idle},
		}, "r2"},
		{"new replica wins when the cached ones queue", 4000, []Candidate{
			{Name: "old1", Match: kvindex.Match{GPU: 200}, Load: busy},
			{Name: "old2", Match: kvindex.Match{GPU: 200}, Load: busy},
			{Name: "new", Load: idle},
		}, "new"},
		{"CPU tier counts 0.75, storage 0.25", 3200, []Candidate{
			{Name: "cpu", Match: kvindex.Match{CPU: 200}, Load: idle},
			{Name: "storage", Match: kvindex.Match{Storage: 200}, Load: idle},
		}, "cpu"},
		{"predicted blocks count like GPU", 3200, []Candidate{
			{Name: "pred", Match: kvindex.Match{Predicted: 150}, Load: idle},
			{Name: "cpu", Match: kvindex.Match{CPU: 150}, Load: idle},
		}, "pred"},
	}
	for _, tc := range tests {
		for _, perm := range permutations(len(tc.cands)) {
			t.Run(fmt.Sprintf("%s/%v", tc.name, perm), func(t *testing.T) {
				p, err := NewPolicy("kv", Config{Rand: rand.New(rand.NewPCG(1, 2))})
				if err != nil {
					t.Fatal(err)
				}
				cands := make([]Candidate, len(perm))
				for i, j := range perm {
					cands[i] = tc.cands[j]
				}
				d := p.Pick(&Request{PromptTokens: tc.prompt}, cands)
				if d.Name != tc.want {
					t.Fatalf("picked %s (%s), want %s; terms %+v", d.Name, d.Reason, tc.want, d.Terms)
				}
			})
		}
	}
}

// Router-level scenarios, run against both the exact and the approximate
// index (the one-method lookup both implement).
func TestScenarioBAOnBothIndexes(t *testing.T) {
	a, b := tokens(1, 256), tokens(2, 256)
	for _, kind := range indexKinds {
		t.Run(kind, func(t *testing.T) {
			f := newFleet(t, kind, "kv", 1, "r1", "r2", "r3")
			f.hold("r1", a)
			f.hold("r2", b)
			for i := range 10 {
				d, l := f.route(cat(b, a, tokens(100+i, 40)), nil)
				if d.Name != "r2" {
					t.Fatalf("request %d went to %s: %+v", i, d.Name, d.Terms)
				}
				l.Release()
			}
		})
	}
}

// TestScenarioApproxAffinityAfterIdle: with the approximate index (no KV
// events), a long system prompt sent again after 7 idle minutes goes back
// to the replica it was routed to, with its blocks counted as cached: the
// engine still holds them (nothing else filled its cache), so the index
// must too (LiteLLM #16522, #28427: a 120 s TTL sent it to a cold replica).
func TestScenarioApproxAffinityAfterIdle(t *testing.T) {
	system := tokens(11, 8192)
	f := newFleet(t, "approx", "kv", 4, "r1", "r2", "r3", "r4")
	d, l := f.route(cat(system, tokens(12, 100)), nil)
	l.Release()
	f.clock.Add(7 * time.Minute)
	d2, l2 := f.route(cat(system, tokens(13, 120)), nil)
	l2.Release()
	if d2.Name != d.Name || d2.Chosen().CachedBlocks != len(system)/bs {
		t.Fatalf("after 7 idle minutes: %s with %d cached blocks, want %s with %d: %+v",
			d2.Name, d2.Chosen().CachedBlocks, d.Name, len(system)/bs, d2.Terms)
	}
}

func TestScenarioSharedSystemPromptBalanced(t *testing.T) {
	system := tokens(7, 4096)
	for _, kind := range indexKinds {
		t.Run(kind, func(t *testing.T) {
			f := newFleet(t, kind, "kv", 2, "r1", "r2")
			f.hold("r1", system)
			count := map[string]int{}
			var leases []*Lease
			for u := range 50 {
				d, l := f.route(cat(system, tokens(1000+u, 200)), nil)
				count[d.Name]++
				leases = append(leases, l)
				if u%5 == 4 { // some finish, most stay in flight: load builds
					leases[u-4].Release()
				}
			}
			t.Logf("split %v", count)
			if count["r1"] < 15 || count["r2"] < 15 {
				t.Fatalf("split %v: a replica starves", count)
			}
		})
	}
}

func TestScenarioUniquePromptsGoToIdle(t *testing.T) {
	for _, kind := range indexKinds {
		t.Run(kind, func(t *testing.T) {
			f := newFleet(t, kind, "kv", 3, "r1", "r2")
			for i := range 40 { // r2 has a large index
				f.hold("r2", tokens(5000+i, 2048))
			}
			f.hold("r1", tokens(9000, 64))
			for range 5 { // r1 busy
				f.r.ObserveGauges("r1", Gauges{Waiting: 4, At: f.clock.Now()})
				d, _ := f.route(tokens(9000, 64), func(r *Request) { r.Exclude = []string{"r2"} })
				if d.Name != "r1" {
					t.Fatal("exclude ignored")
				}
			}
			for i := range 10 {
				d, l := f.route(tokens(20_000+i, 6000), nil)
				if d.Name != "r2" {
					t.Fatalf("unique prompt %d to busy %s: %+v", i, d.Name, d.Terms)
				}
				l.Release()
			}
		})
	}
}

func TestScenarioHotReplicaKeepsPrefixRouting(t *testing.T) {
	hotPrefix, other := tokens(1, 4096), tokens(2, 4096)
	for _, kind := range indexKinds {
		t.Run(kind, func(t *testing.T) {
			f := newFleet(t, kind, "kv", 4, "hot", "best", "cold")
			f.hold("hot", hotPrefix)
			f.hold("best", other)
			for i := range 30 { // the hot prefix loads "hot"
				f.route(cat(hotPrefix, tokens(100+i, 100)), func(r *Request) { r.Exclude = []string{"best", "cold"} })
			}
			for i := range 10 {
				d, l := f.route(cat(other, tokens(300+i, 100)), nil)
				if d.Name != "best" {
					t.Fatalf("request %d for the idle best replica went to %s", i, d.Name)
				}
				l.Release()
			}
		})
	}
}

func TestScenarioSessionBurstLandsTogether(t *testing.T) {
	for _, kind := range indexKinds {
		t.Run(kind, func(t *testing.T) {
			f := newFleet(t, kind, "session", 5, "r1", "r2", "r3", "r4")
			var wg sync.WaitGroup
			got := make([]string, 8)
			for i := range 8 {
				wg.Go(func() {
					d, l, err := f.r.Route(&Request{Tokens: tokens(i, 300), SessionKey: "conv-42"})
					if err != nil {
						t.Error(err)
						return
					}
					got[i] = d.Name
					l.Release()
				})
			}
			wg.Wait()
			for _, g := range got {
				if g != got[0] {
					t.Fatalf("one session split across %v", got)
				}
			}
		})
	}
}

func TestScenarioNewReplicaGetsTraffic(t *testing.T) {
	prefixes := [][]uint32{tokens(1, 2048), tokens(2, 2048), tokens(3, 2048)}
	for _, kind := range indexKinds {
		t.Run(kind, func(t *testing.T) {
			f := newFleet(t, kind, "kv", 6, "r1", "r2", "r3")
			for i, p := range prefixes {
				f.hold(fmt.Sprintf("r%d", i+1), p)
			}
			// A busy fleet: 150 requests in flight, 50 a replica with 500
			// uncached tokens each, 2.5 s of queued prefill: busier than
			// kv's affinity slack (2 s), under which a continuation stays
			// with its cache.
			for i := range 150 {
				f.route(cat(prefixes[i%3], tokens(100+i, 500)), nil)
			}
			f.r.AddReplica("r4")
			got := 0
			for i := range 20 {
				d, _ := f.route(cat(prefixes[i%3], tokens(1000+i, 500)), nil)
				if d.Name == "r4" {
					got++
				}
			}
			t.Logf("r4 got %d of 20", got)
			if got == 0 {
				t.Fatal("new replica got no traffic from a busy fleet")
			}
		})
	}
}

func TestScenarioShortPromptByLoad(t *testing.T) {
	for _, kind := range indexKinds {
		t.Run(kind, func(t *testing.T) {
			f := newFleet(t, kind, "kv", 7, "r1", "r2")
			short := tokens(1, 10)
			f.hold("r1", tokens(1, 16)) // r1 "matches" the short prompt's text
			f.route(tokens(50, 2000), func(r *Request) { r.Exclude = []string{"r2"} })
			for range 5 {
				d, l := f.route(short, nil)
				if d.Name != "r2" {
					t.Fatalf("short prompt to loaded %s", d.Name)
				}
				l.Release()
			}
		})
	}
}
