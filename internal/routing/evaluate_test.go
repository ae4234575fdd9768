package routing

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"kvrouter/internal/kvindex"
	"kvrouter/internal/vllm"
)

// evalWorkload is a deterministic request stream: conversations that grow
// turn by turn over a shared system prompt, some with a session key, and
// text for prefix_chars.
func evalWorkload(n int) []Request {
	rng := rand.New(rand.NewPCG(11, 12))
	system := tokens(900, 256)
	convs := make([][]uint32, 6)
	out := make([]Request, n)
	for i := range out {
		c := rng.IntN(len(convs))
		if convs[c] == nil {
			convs[c] = cat(system, tokens(c, 64))
		}
		convs[c] = cat(convs[c], tokens(1000+i, 16+rng.IntN(64)))
		req := Request{Tokens: slices.Clone(convs[c]), MaxTokens: 50,
			Text: fmt.Sprint("system prompt ", strings.Repeat("x", 200), " conversation ", c, " turn ", i)}
		if c%2 == 0 {
			req.SessionKey = fmt.Sprint("s", c)
		}
		out[i] = req
	}
	return out
}

// evalFleet is a fleet where r1 holds the system prompt and r2 one
// conversation's first turn.
func evalFleet(t *testing.T, policy string) *fleet {
	f := newFleet(t, "exact", policy, 5, "r0", "r1", "r2", "r3")
	f.hold("r1", tokens(900, 256))
	f.hold("r2", cat(tokens(900, 256), tokens(1, 64)))
	return f
}

// TestEvaluateRecordsNothing: for every policy, a router that Evaluates
// each request (with its own policy and with a shadow kv policy) before
// routing it makes exactly the decisions of a router with the same seed
// that only routes: Evaluate moved no round-robin counter, drew no random
// number, inserted nothing in a trie and predicted nothing in the index.
// And Evaluate then Route choose the same replica whenever the choice is
// not random.
func TestEvaluateRecordsNothing(t *testing.T) {
	reqs := evalWorkload(60)
	for _, policy := range Policies() {
		t.Run(policy, func(t *testing.T) {
			plain, probed := evalFleet(t, policy), evalFleet(t, policy)
			shadow, err := probed.r.NewPolicy("kv")
			if err != nil {
				t.Fatal(err)
			}
			var leases []*Lease
			same := 0
			for i := range reqs {
				a, b := reqs[i], reqs[i]
				da, la := plain.route(a.Tokens, func(r *Request) { *r = a })
				ev, err := probed.r.Evaluate(&b, nil)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := probed.r.Evaluate(&b, shadow); err != nil {
					t.Fatal(err)
				}
				db, lb := probed.route(b.Tokens, func(r *Request) { *r = b })
				if !reflect.DeepEqual(da, db) {
					t.Fatalf("request %d: routed %+v after Evaluate, %+v without", i, db, da)
				}
				random := policy == "random" || policy == "prefix_chars" || strings.Contains(db.Reason, "tie_random")
				if !random {
					if ev.Name != db.Name || !reflect.DeepEqual(ev.Terms, db.Terms) {
						t.Fatalf("request %d: Evaluate chose %s %+v, Route %s %+v", i, ev.Name, ev.Terms, db.Name, db.Terms)
					}
					same++
				}
				// Release some leases to vary the load.
				leases = append(leases, la, lb)
				if i%3 == 2 {
					for _, l := range leases[:4] {
						l.FirstToken()
						l.Release()
					}
					leases = leases[4:]
				}
			}
			if policy != "random" && policy != "prefix_chars" && same < len(reqs)/2 {
				t.Errorf("only %d of %d decisions were deterministic", same, len(reqs))
			}
		})
	}
}

// TestEvaluateChangesNoState checks the router's and index's observable
// state around Evaluate: loads, decision counts, the index's lookup
// (predictions included) and the round-robin position.
func TestEvaluateChangesNoState(t *testing.T) {
	for _, policy := range []string{"kv", "round_robin"} {
		f := evalFleet(t, policy)
		x := f.ix.(*kvindex.Exact)
		_, l := f.route(cat(tokens(900, 256), tokens(2, 64)), nil) // one prediction, one lease
		defer l.Release()
		snapshot := func() (map[string]Load, Stats, kvindex.Stats, []kvindex.Match) {
			loads := map[string]Load{}
			for _, n := range []string{"r0", "r1", "r2", "r3"} {
				loads[n], _ = f.r.Load(n)
			}
			keys := kvindex.Keys(nil, cat(tokens(900, 256), tokens(3, 64)), bs, kvindex.Extras{Root: x.Root()})
			return loads, f.r.Stats(), x.Stats(), x.Lookup(keys, nil)
		}
		l0, s0, x0, m0 := snapshot()
		var first Decision
		for i := range 5 {
			d, err := f.r.Evaluate(&Request{Tokens: cat(tokens(900, 256), tokens(3, 64)), MaxTokens: 10}, nil)
			if err != nil {
				t.Fatal(err)
			}
			if i == 0 {
				first = d
			} else if !reflect.DeepEqual(d, first) {
				t.Fatalf("%s: Evaluate %d gave %+v, first %+v", policy, i, d, first)
			}
		}
		l1, s1, x1, m1 := snapshot()
		if !reflect.DeepEqual(l0, l1) || !reflect.DeepEqual(s0, s1) || x0 != x1 || !reflect.DeepEqual(m0, m1) {
			t.Fatalf("%s: Evaluate changed state:\nloads %v\n   -> %v\nstats %+v\n   -> %+v\nindex %+v\n   -> %+v\nmatches %v -> %v",
				policy, l0, l1, s0, s1, x0, x1, m0, m1)
		}
		d, l2, err := f.r.Route(&Request{Tokens: cat(tokens(900, 256), tokens(3, 64)), MaxTokens: 10})
		if err != nil {
			t.Fatal(err)
		}
		l2.Release()
		if d.Name != first.Name {
			t.Errorf("%s: Evaluate chose %s, the next Route %s", policy, first.Name, d.Name)
		}
	}
	// No replica: the error Route gives, and nothing counted.
	f := newFleet(t, "exact", "kv", 1, "a")
	if d, err := f.r.Evaluate(&Request{Exclude: []string{"a"}}, nil); err != ErrNoReplica || d.Index != -1 {
		t.Errorf("no replica: %+v %v", d, err)
	}
	if s := f.r.Stats(); s.NoReplica != 0 {
		t.Errorf("Evaluate counted a no-replica decision: %+v", s)
	}
}

// TestEvaluateConcurrentWithApplyAndRoute runs, under -race, four engines'
// event subscribers (Apply), routing and evaluation at once.
func TestEvaluateConcurrentWithApplyAndRoute(t *testing.T) {
	f := newFleet(t, "exact", "kv", 3, "e0", "e1", "e2", "e3")
	x := f.ix.(*kvindex.Exact)
	shadow, _ := f.r.NewPolicy("kv")
	reqs := evalWorkload(200)
	var wg sync.WaitGroup
	for e := range 4 {
		wg.Go(func() {
			name := fmt.Sprint("e", e)
			for i := e; i < len(reqs); i += 4 {
				hold(x, name, uint64(e)<<32|uint64(i)<<12, reqs[i].Tokens)
			}
		})
	}
	for g := range 2 {
		wg.Go(func() {
			for i := g; i < len(reqs); i += 2 {
				req := reqs[i]
				// A block no engine stores: every Route predicts, whatever
				// the Applies have stored by then.
				req.Tokens = cat(req.Tokens, tokens(500_000+i, 32))
				if _, err := f.r.Evaluate(&req, shadow); err != nil {
					t.Error(err)
					return
				}
				d, l, err := f.r.Route(&req)
				if err != nil || d.Index < 0 {
					t.Error(d, err)
					return
				}
				l.Release()
			}
		})
	}
	wg.Wait()
	for _, n := range []string{"e0", "e1", "e2", "e3"} {
		if l, _ := f.r.Load(n); l.InFlight != 0 || l.QueuedPrefill != 0 {
			t.Errorf("%s load after all releases: %+v", n, l)
		}
	}
	if s := x.Stats(); s.Predicted == 0 || s.Stored == 0 {
		t.Errorf("nothing exercised: %+v", s)
	}
}

// hold applies one BlockStored of toks' full blocks by engine name, engine
// hashes from base.
func hold(x *kvindex.Exact, name string, base uint64, toks []uint32) {
	n := len(toks) / bs
	hs := make([]vllm.BlockHash, n)
	for i := range hs {
		hs[i] = vllm.BlockHash(base + uint64(i) + 1)
	}
	x.Apply(name, &vllm.Batch{Events: []vllm.Event{{Type: vllm.BlockStored, BlockHashes: hs, TokenIDs: toks[:n*bs], BlockSize: bs}}})
}

// TestEvaluateTieBreak: where Pick draws at random among equally loaded
// ties, Evaluate takes the most confirmed cache, then the first candidate.
func TestEvaluateTieBreak(t *testing.T) {
	p, _ := NewPolicy("kv", seeded(1))
	ld := Load{PrefillRate: 10000, DecodeRate: 2000}
	cands := []Candidate{
		{Name: "a", Match: kvindex.Match{Predicted: 20}, Load: ld},
		{Name: "b", Match: kvindex.Match{GPU: 20}, Load: ld},
		{Name: "c", Match: kvindex.Match{GPU: 5, Predicted: 15}, Load: ld},
	}
	req := &Request{PromptTokens: 320}
	for range 20 {
		if d := p.(Evaluator).Evaluate(req, cands); d.Name != "b" || d.Reason != "tie_random" {
			t.Fatalf("Evaluate %s (%s), want b: all tie, b's cache is confirmed", d.Name, d.Reason)
		}
	}
	cands[1].Match = kvindex.Match{Predicted: 20}
	cands[2].Match = kvindex.Match{Predicted: 20}
	if d := p.(Evaluator).Evaluate(req, cands); d.Name != "a" {
		t.Fatalf("Evaluate %s, want the first of identical candidates", d.Name)
	}
	seen := map[string]bool{}
	for range 100 {
		seen[p.Pick(req, cands).Name] = true
	}
	if len(seen) != 3 {
		t.Fatalf("Pick no longer breaks ties at random: %v", seen)
	}
}
