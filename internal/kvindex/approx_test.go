package kvindex

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// testApprox is an Approx with block size 4 on a test clock and the
// default configuration otherwise (no TTL).
func testApprox(c *clock, mod func(*Config)) *Approx {
	cfg := Config{Model: "m", BlockSize: 4, Now: c.Now}
	if mod != nil {
		mod(&cfg)
	}
	a, err := NewApprox(cfg, nil, nil)
	if err != nil {
		panic(err)
	}
	return a
}

// routeTo records a routed request of tokens to name.
func routeTo(a *Approx, name string, tokens []uint32) {
	id, _ := a.ReplicaID(name)
	a.Routed(id, Keys(nil, tokens, a.BlockSize(), Extras{Root: a.Root()}))
}

// TestApproxKeepsAffinityWhileIdle is LiteLLM's complaint (#16522,
// #28427): a long system prompt sent again after 7 idle minutes must still
// be found where it was routed, because nothing else has filled that
// engine's cache since. The default configuration has no time limit.
func TestApproxKeepsAffinityWhileIdle(t *testing.T) {
	c := newClock()
	a := testApprox(c, nil)
	for _, n := range []string{"r0", "r1", "r2"} {
		a.AddReplica(n)
	}
	a.SetCapacity("r1", 4096)
	system := seq(1, 4000) // 1,000 blocks
	routeTo(a, "r1", cat(system, seq(90_000, 37)))
	routeTo(a, "r0", seq(50_000, 400)) // other traffic, elsewhere
	c.Add(7 * time.Minute)
	if m := lookupOf(a, "r1", cat(system, seq(91_000, 50)), Extras{}); m.GPU != 1000 {
		t.Fatalf("after 7 idle minutes r1 matches %+v, want the 1,000 system-prompt blocks", m)
	}
	c.Add(24 * time.Hour)
	if m := lookupOf(a, "r1", system, Extras{}); m.GPU != 1000 {
		t.Fatalf("after a day with no traffic r1 matches %+v, want 1,000 blocks", m)
	}
	if s := a.Stats(); s.Evicted != 0 {
		t.Fatalf("evicted %d entries without any capacity pressure", s.Evicted)
	}
}

// TestApproxTTL: a configured TTL is an upper bound on top of capacity.
func TestApproxTTL(t *testing.T) {
	c := newClock()
	a := testApprox(c, func(cfg *Config) { cfg.ApproxTTL = 10 * time.Second })
	r := a.AddReplica("r")
	a.Routed(r, Keys(nil, abcd, 4, Extras{Root: a.Root()}))
	if m := lookupOf(a, "r", abcd, Extras{}); m.GPU != 4 {
		t.Fatalf("routed blocks: %+v", m)
	}
	c.Add(11 * time.Second)
	if m := lookupOf(a, "r", abcd, Extras{}); m.Blocks() != 0 {
		t.Fatalf("expired blocks still match: %+v", m)
	}
	a.Routed(r, Keys(nil, abcd[:4], 4, Extras{Root: a.Root()}))
	if s := a.Stats(); s.Entries != 1 || s.Evicted != 4 {
		t.Fatalf("stats %+v", s)
	}
	if _, err := NewApprox(Config{ApproxTTL: -time.Second}, nil, nil); err == nil {
		t.Fatal("negative approx_ttl accepted")
	}
}

func TestApproxCapacityLRU(t *testing.T) {
	c := newClock()
	a := testApprox(c, nil)
	a.SetCapacity("r", 3)
	r, _ := a.ReplicaID("r")
	a.Routed(r, Keys(nil, abcd, 4, Extras{Root: a.Root()}))
	// Capacity 3: the deepest block goes first, the prefix stays.
	if m := lookupOf(a, "r", abcd, Extras{}); m.GPU != 3 {
		t.Fatalf("capacity 3: %+v", m)
	}
	other := seq(500, 8)
	a.Routed(r, Keys(nil, other, 4, Extras{Root: a.Root()}))
	if m := lookupOf(a, "r", abcd, Extras{}); m.GPU != 1 {
		t.Fatalf("after 2 more blocks: %+v, want 1 left", m)
	}
	if got := a.ReplicaBlocks(r); got != 3 {
		t.Fatalf("ReplicaBlocks = %d", got)
	}
	if !a.RemoveReplica("r") || a.Stats().Entries != 0 {
		t.Fatal("RemoveReplica must drop entries")
	}
}

// TestApproxRoutedHitRefreshes: a request routed to a replica that holds
// its prefix makes those blocks the most recent, as the engine's LRU does
// when it reuses them; a Lookup alone refreshes nothing. Capacity 6 blocks,
// prompts of 3: A, B, A again, then C evicts B, not A.
func TestApproxRoutedHitRefreshes(t *testing.T) {
	pa, pb, pc, pd := seq(100, 12), seq(200, 12), seq(300, 12), seq(400, 12)
	c := newClock()
	a := testApprox(c, nil)
	a.SetCapacity("r", 6)
	routeTo(a, "r", pa)
	routeTo(a, "r", pb)
	routeTo(a, "r", pa) // a hit: refreshed
	routeTo(a, "r", pc)
	if ma, mb := lookupOf(a, "r", pa, Extras{}), lookupOf(a, "r", pb, Extras{}); ma.GPU != 3 || mb.GPU != 0 {
		t.Fatalf("after A B A C: A %+v B %+v, want A kept (refreshed) and B evicted", ma, mb)
	}
	// Lookups of A (now the least recent) do not keep it.
	for range 3 {
		lookupOf(a, "r", pa, Extras{})
	}
	routeTo(a, "r", pd)
	if ma, mc := lookupOf(a, "r", pa, Extras{}), lookupOf(a, "r", pc, Extras{}); ma.GPU != 0 || mc.GPU != 3 {
		t.Fatalf("after D: A %+v C %+v, want A evicted (least recent, only looked up) and C kept", ma, mc)
	}
	if m := lookupOf(a, "r", pd, Extras{}); m.GPU != 3 {
		t.Fatalf("D %+v", m)
	}
}

// TestApproxPartialHitOrder: a request that shares a prefix with a held
// prompt refreshes the shared blocks; the old prompt's own deep blocks
// stay least recent and go first, in reverse order (deepest first).
func TestApproxPartialHitOrder(t *testing.T) {
	c := newClock()
	a := testApprox(c, nil)
	a.SetCapacity("r", 6)
	shared := seq(1, 8)                       // 2 blocks
	routeTo(a, "r", cat(shared, seq(100, 8))) // S1 S2 X1 X2
	routeTo(a, "r", cat(shared, seq(200, 8))) // S1 S2 Y1 Y2: 6 held
	routeTo(a, "r", seq(300, 4))              // Z1 evicts X2
	if m := lookupOf(a, "r", cat(shared, seq(100, 8)), Extras{}); m.GPU != 3 {
		t.Fatalf("X prompt %+v, want S1 S2 X1 (X2, the deepest, evicted first)", m)
	}
	if m := lookupOf(a, "r", cat(shared, seq(200, 8)), Extras{}); m.GPU != 4 {
		t.Fatalf("Y prompt %+v, want all 4", m)
	}
}

// TestApproxLRUAcrossSlabChunks: the LRU links kept beside the entry slab
// stay in step with it past its first chunk (chunkLen entries), with
// two replicas' lists interleaved in the slab and entries freed and reused.
func TestApproxLRUAcrossSlabChunks(t *testing.T) {
	c := newClock()
	a := testApprox(c, nil)
	a.AddReplica("r0")
	a.AddReplica("r1")
	const first, fresh, capacity = 12_000, 10_000, 20_000 // blocks
	a.SetCapacity("r0", capacity)
	a.SetCapacity("r1", capacity)
	prompt := seq(1, 4*first)
	other := seq(10_000_000, 4*3_000)
	for i := 0; i < first; i += 1_000 {
		// Each request extends the prompt: the slab interleaves r0's and
		// r1's entries.
		routeTo(a, "r0", prompt[:4*(i+1_000)])
		routeTo(a, "r1", other[:4*min(i/4+1_000, 3_000)])
	}
	if n := a.Stats().Entries; n <= chunkLen {
		t.Fatalf("%d entries, want more than one slab chunk (%d)", n, chunkLen)
	}
	// The first 2,000 blocks become r0's most recent; 10,000 new ones then
	// push r0 2,000 over capacity, which must evict the prompt's last 2,000
	// blocks (the least recent), and nothing of r1.
	routeTo(a, "r0", prompt[:4*2_000])
	routeTo(a, "r0", seq(20_000_000, 4*fresh))
	if m := lookupOf(a, "r0", prompt, Extras{}); m.GPU != first-2_000 {
		t.Fatalf("r0 matches %+v of the prompt, want its first %d blocks", m, first-2_000)
	}
	if m := lookupOf(a, "r0", seq(20_000_000, 4*fresh), Extras{}); m.GPU != fresh {
		t.Fatalf("r0 matches %+v of the new blocks, want all %d", m, fresh)
	}
	if m := lookupOf(a, "r1", other, Extras{}); m.GPU != 3_000 {
		t.Fatalf("r1 matches %+v, want its 3,000 blocks", m)
	}
	if got := a.Stats().Evicted; got != 2_000 {
		t.Fatalf("evicted %d entries, want 2,000", got)
	}
	// Freed entries are reused: 2,000 more new blocks evict the prompt's
	// next least recent 2,000.
	routeTo(a, "r0", seq(30_000_000, 4*2_000))
	if m := lookupOf(a, "r0", prompt, Extras{}); m.GPU != first-4_000 {
		t.Fatalf("after reuse r0 matches %+v of the prompt, want %d blocks", m, first-4_000)
	}
}

// TestApproxRoutedLRUModel checks Routed against a plain model of each
// replica's LRU list (each key in turn, from the last, moved or inserted
// at the front; the least recent beyond capacity evicted): after every
// call of a random mix of new prompts, continued prompts, shared prefixes,
// repeated and duplicate keys over six replicas, each replica's list holds
// the model's keys in the model's order.
func TestApproxRoutedLRUModel(t *testing.T) {
	const capacity = 40
	rng := rand.New(rand.NewPCG(7, 7))
	c := newClock()
	a := testApprox(c, nil)
	names := []string{"r0", "r1", "r2", "r3", "r4", "r5"} // more holders of a key than routedWalk
	model := map[ReplicaID][]Key{}
	var prompts [][]Key
	for step := range 3000 {
		var keys []Key
		switch r := rng.IntN(6); {
		case r == 0 || len(prompts) == 0: // new
			for range 1 + rng.IntN(12) {
				keys = append(keys, Key(rng.Uint64()))
			}
		case r <= 2: // a prompt again, continued by a few new keys
			keys = append(keys, prompts[rng.IntN(len(prompts))]...)
			for range rng.IntN(4) {
				keys = append(keys, Key(rng.Uint64()))
			}
		case r == 3: // a prefix of a prompt
			p := prompts[rng.IntN(len(prompts))]
			keys = append(keys, p[:1+rng.IntN(len(p))]...)
		case r == 4: // two prompts' keys joined, some repeated
			keys = append(keys, prompts[rng.IntN(len(prompts))]...)
			keys = append(keys, prompts[rng.IntN(len(prompts))]...)
		default: // keys picked from prompts in any order
			for range 1 + rng.IntN(20) {
				p := prompts[rng.IntN(len(prompts))]
				keys = append(keys, p[rng.IntN(len(p))])
			}
		}
		prompts = append(prompts, keys)
		if len(prompts) > 30 {
			prompts = prompts[1:]
		}
		id := a.AddReplica(names[rng.IntN(len(names))])
		a.SetCapacity(names[id], capacity)
		a.Routed(id, keys)
		l := model[id]
		for i := len(keys) - 1; i >= 0; i-- {
			l = slices.DeleteFunc(l, func(k Key) bool { return k == keys[i] })
			l = append([]Key{keys[i]}, l...)
		}
		model[id] = l[:min(len(l), capacity)]
		for r, want := range model {
			var got []Key
			for idx := a.st.listOf(a.srcOf[r] - 1).head; idx != 0; idx = a.st.lnk(idx).next {
				got = append(got, a.st.ent(idx).key)
			}
			if !slices.Equal(got, want) {
				t.Fatalf("step %d, replica %d: list %v, model %v", step, r, got, want)
			}
		}
	}
}

// lookupByWalk is Approx.Lookup walking every key's holders, as it did
// before following the replicas' lists.
func lookupByWalk(a *Approx, keys []Key) []Match {
	a.mu.RLock()
	defer a.mu.RUnlock()
	out := resize(nil, len(a.reps.names))
	now, _ := a.expiry()
	for i, k := range keys {
		if walk(&a.st, k, int32(i), out, tierGPU, uint64(now)) == 0 {
			break
		}
	}
	return finish(out)
}

// TestApproxLookupFollowsLists holds Lookup, which follows each replica's
// list from one key's entry to the next while it can, to walking every
// key's holders: random new, continued, shared, truncated, joined and
// shuffled prompts routed to 6 or 20 replicas (more than Lookup tracks),
// with and without a TTL whose clock moves on (expired entries count for
// nothing), each followed by Lookups of random prompts.
func TestApproxLookupFollowsLists(t *testing.T) {
	for _, tc := range []struct {
		replicas int
		ttl      time.Duration
	}{{6, 0}, {6, 50 * time.Second}, {20, 0}} {
		rng := rand.New(rand.NewPCG(11, uint64(tc.replicas)))
		c := newClock()
		a := testApprox(c, func(cfg *Config) { cfg.ApproxTTL = tc.ttl })
		var prompts [][]Key
		checked, followed := 0, 0
		for step := range 2000 {
			var keys []Key
			switch r := rng.IntN(6); {
			case r == 0 || len(prompts) == 0:
				for range 1 + rng.IntN(24) {
					keys = append(keys, Key(rng.Uint64()))
				}
			case r <= 2:
				keys = append(keys, prompts[rng.IntN(len(prompts))]...)
				for range rng.IntN(4) {
					keys = append(keys, Key(rng.Uint64()))
				}
			case r == 3:
				p := prompts[rng.IntN(len(prompts))]
				keys = append(keys, p[:1+rng.IntN(len(p))]...)
			case r == 4:
				keys = append(keys, prompts[rng.IntN(len(prompts))]...)
				keys = append(keys, prompts[rng.IntN(len(prompts))]...)
			default:
				for range 1 + rng.IntN(20) {
					p := prompts[rng.IntN(len(prompts))]
					keys = append(keys, p[rng.IntN(len(p))])
				}
			}
			prompts = append(prompts, keys)
			if len(prompts) > 40 {
				prompts = prompts[1:]
			}
			name := fmt.Sprintf("r%d", rng.IntN(tc.replicas))
			id := a.AddReplica(name)
			a.SetCapacity(name, 60)
			a.Routed(id, keys)
			c.Add(time.Duration(rng.IntN(3)) * time.Second)
			for range 3 {
				q := slices.Clone(prompts[rng.IntN(len(prompts))])
				if rng.IntN(3) == 0 {
					q = append(q, Key(rng.Uint64()))
				}
				got, want := a.Lookup(q, nil), lookupByWalk(a, q)
				if !slices.Equal(got, want) {
					t.Fatalf("%d replicas, ttl %v, step %d: Lookup %v, walking %v", tc.replicas, tc.ttl, step, got, want)
				}
				checked++
				for _, m := range want {
					if m.Blocks() > 1 {
						followed++
						break
					}
				}
			}
		}
		if followed < checked/4 {
			t.Errorf("%d replicas: %d of %d lookups matched more than one block, want a quarter or more", tc.replicas, followed, checked)
		}
	}
}

// TestApproxLookupExpiredTail: a prompt's tail that expired while its
// prefix, routed again since, did not stays out of the replica's match,
// though it follows the prefix in the replica's list (one replica's run
// and two replicas' runs).
func TestApproxLookupExpiredTail(t *testing.T) {
	for _, names := range [][]string{{"r0"}, {"r0", "r1"}} {
		c := newClock()
		a := testApprox(c, func(cfg *Config) { cfg.ApproxTTL = 50 * time.Second })
		keys := []Key{1, 2, 3, 4}
		for _, n := range names {
			a.Routed(a.AddReplica(n), keys)
		}
		c.Add(40 * time.Second)
		for _, n := range names {
			id, _ := a.ReplicaID(n)
			a.Routed(id, keys[:2]) // refreshes 1 and 2; 3 and 4 stay after them
		}
		c.Add(20 * time.Second) // 3 and 4 expired, not evicted: no Routed since
		got := a.Lookup(keys, nil)
		for i, n := range names {
			if got[i].Blocks() != 2 {
				t.Errorf("replicas %v: %s matches %+v, want 2 blocks", names, n, got[i])
			}
		}
		if want := lookupByWalk(a, keys); !slices.Equal(got, want) {
			t.Errorf("replicas %v: Lookup %v, walking %v", names, got, want)
		}
	}
}
