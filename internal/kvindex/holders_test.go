package kvindex

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"kvrouter/internal/vllm"
)

// TestLookupSetsMatchesWalk drives Exact with random stores, removals,
// clears and replica removals over prompts sharing prefixes (several ranks,
// mediums, duplicate copies, predictions, more than 64 replicas) and checks
// after every step that the bit-set Lookup equals the per-holder walk and
// that every holder record agrees with its key's entries.
func TestLookupSetsMatchesWalk(t *testing.T) {
	for _, replicas := range []int{5, 70, 140} {
		t.Run(fmt.Sprintf("replicas=%d", replicas), func(t *testing.T) {
			const bs, blocks, prompts = 4, 12, 16
			c := newClock()
			x := testExact(c, func(cfg *Config) { cfg.PredictTTL = 3 * time.Second })
			rng := rand.New(rand.NewPCG(uint64(replicas), 7))
			toks := make([][]uint32, prompts)
			keys := make([][]Key, prompts)
			for p := range toks {
				shared := p % 6 // prompts share up to 5 leading blocks
				toks[p] = append(seq(0, shared*bs), seq(1000*(p+1), (blocks-shared)*bs)...)
				keys[p] = Keys(nil, toks[p], bs, Extras{Root: x.Root()})
			}
			// Engine hash of prompt p's block i: distinct per prompt, so
			// shared prefixes give one replica several entries per key.
			eh := func(p, i int) uint64 { return uint64(p*100 + i + 1) }
			mediums := []string{"GPU", "CPU", "STORAGE", ""}
			name := func(r int) string { return fmt.Sprintf("r%03d", r) }
			for r := range replicas {
				x.AddReplica(name(r))
			}
			for step := range 400 {
				r, rank, p := rng.IntN(replicas), rng.IntN(2), rng.IntN(prompts)
				med := mediums[rng.IntN(len(mediums))]
				switch op := rng.IntN(20); {
				case op < 11:
					n := 1 + rng.IntN(blocks)
					hs := make([]uint64, n)
					for i := range hs {
						hs[i] = eh(p, i)
					}
					x.Apply(name(r), batch(rank, storedEv(nil, hs, toks[p][:n*bs], med)))
				case op < 17:
					var hs []uint64
					for i := range blocks {
						if rng.IntN(3) == 0 {
							hs = append(hs, eh(p, i))
						}
					}
					x.Apply(name(r), batch(rank, removedEv(med, hs...)))
				case op < 18:
					x.Routed(ReplicaID(r), keys[p])
					c.Add(time.Second)
				case op < 19:
					x.Apply(name(r), batch(rank, vllm.Event{Type: vllm.AllBlocksCleared}))
				default:
					x.RemoveReplica(name(r))
					x.AddReplica(name(r))
				}
				checkRecs(t, &x.st)
				if got, want := x.heldPrefix(ReplicaID(r), keys[p]), heldPrefixWalk(&x.st, ReplicaID(r), keys[p]); got != want {
					t.Fatalf("step %d: heldPrefix(%d, prompt %d) = %d, walk says %d", step, r, p, got, want)
				}
				for q := range prompts {
					fast := x.Lookup(keys[q], nil)
					// RoutedMatch's shortcut: a run without predicted
					// blocks is held, and the block after it is not.
					if m := fast[r]; m.Predicted == 0 {
						if got, want := m.Blocks()+x.heldPrefix(ReplicaID(r), keys[q][m.Blocks():]), x.heldPrefix(ReplicaID(r), keys[q]); got != want {
							t.Fatalf("step %d prompt %d replica %d: run %d + held after it = %d, held prefix %d", step, q, r, m.Blocks(), got, want)
						}
					}
					slow := x.lookupAll(keys[q])
					for i := range fast {
						if fast[i] != slow[i] {
							t.Fatalf("step %d prompt %d replica %d: sets %+v, walk %+v", step, q, i, fast[i], slow[i])
						}
					}
				}
			}
			if x.st.nrecs == 0 {
				t.Fatal("no holder record was created: the test does not exercise them")
			}
		})
	}
}

// lookupAll is Lookup through the per-holder walk.
func (x *Exact) lookupAll(keys []Key) []Match {
	x.mu.RLock()
	defer x.mu.RUnlock()
	out := resize(nil, len(x.reps.names))
	return x.lookupWalk(keys, out, x.covers(nil, keys, len(out)))
}

// checkRecs verifies the holder records: one per key with 2 or more
// entries reached through recMin(), none for a single entry, and each
// replica's code equal to its best entry's.
func checkRecs(t *testing.T, st *store) {
	t.Helper()
	recs := 0
	for i := range st.keys.size() {
		v := st.keys.get(i)
		if v == 0 {
			continue
		}
		head, n := v, 0
		if v&recTag != 0 {
			recs++
			r := st.rec(v)
			head = uint32(r[1])
			codes := map[ReplicaID]uint64{}
			for p := head; p != 0; p = st.ent(p).next {
				e := st.ent(p)
				rep := st.srcs[e.src].replica
				codes[rep] = max(codes[rep], entryCode(&e.refs))
				if uint64(e.key) != r[0] {
					t.Fatalf("record key %x holds entry of key %x", r[0], e.key)
				}
			}
			for rep := range ReplicaID(64 * st.w) {
				if got := getCode(r, rep); got != codes[rep] {
					t.Fatalf("record of key %x: replica %d code %d, entries say %d", r[0], rep, got, codes[rep])
				}
			}
			if got := int(r[1] >> 32); got < 2 {
				t.Fatalf("record with %d entries", got)
			}
		}
		for p := head; p != 0; p = st.ent(p).next {
			n++
		}
		if v&recTag != 0 && n != int(st.rec(v)[1]>>32) {
			t.Fatalf("record count %d, chain %d", st.rec(v)[1]>>32, n)
		}
		if v&recTag == 0 && n >= int(st.recMin()) {
			t.Fatalf("chain of %d entries without a record", n)
		}
	}
	if recs != st.nrecs {
		t.Fatalf("nrecs %d, table has %d", st.nrecs, recs)
	}
}

// heldPrefixWalk is Exact.heldPrefix through the holder chains.
func heldPrefixWalk(st *store, id ReplicaID, keys []Key) int {
	for i, k := range keys {
		found := false
		for idx := st.head(k); idx != 0; idx = st.ent(idx).next {
			e := st.ent(idx)
			if st.srcs[e.src].replica == id && e.refs != [3]uint16{} {
				found = true
			}
		}
		if !found {
			return i
		}
	}
	return len(keys)
}

// TestRoutedMatchEqualsRouted routes the same prompts with Routed on one
// index and with RoutedMatch (given the Lookup's Match) on an identical one,
// for replicas holding none, part, all of the prompt or holding it only
// through predictions, and checks that both predict the same blocks.
func TestRoutedMatchEqualsRouted(t *testing.T) {
	c := newClock()
	prompt := seq(0, 40) // 10 blocks of 4
	build := func() *Exact {
		x := testExact(c, nil)
		x.AddReplica("none")
		hs := make([]uint64, 10)
		for i := range hs {
			hs[i] = uint64(i + 1)
		}
		x.Apply("part", batch(0, storedEv(nil, hs[:4], prompt[:16], "")))
		x.Apply("cpu", batch(0, storedEv(nil, hs[:6], prompt[:24], "CPU")))
		x.Apply("all", batch(0, storedEv(nil, hs, prompt, "")))
		x.AddReplica("pred")
		return x
	}
	a, b := build(), build()
	keys := Keys(nil, prompt, 4, Extras{Root: a.Root()})
	for round := range 2 {
		for _, name := range []string{"none", "part", "cpu", "all", "pred"} {
			id, _ := a.ReplicaID(name)
			if name == "pred" && round == 0 {
				// predictions only: Match.Predicted > 0 next round
				a.Routed(id, keys[:3])
				b.Routed(id, keys[:3])
			}
			m := b.Lookup(keys, nil)[id]
			a.Routed(id, keys)
			b.RoutedMatch(id, keys, m)
			sa, sb := a.Stats(), b.Stats()
			if sa.Predicted != sb.Predicted || sa.PredictedLive != sb.PredictedLive {
				t.Fatalf("round %d %s (match %+v): Routed predicted %d (%d live), RoutedMatch %d (%d live)",
					round, name, m, sa.Predicted, sa.PredictedLive, sb.Predicted, sb.PredictedLive)
			}
			la, lb := a.Lookup(keys, nil), b.Lookup(keys, nil)
			if la[id] != lb[id] {
				t.Fatalf("round %d %s: after Routed %+v, after RoutedMatch %+v", round, name, la[id], lb[id])
			}
		}
	}
	if a.Stats().Predicted == 0 {
		t.Fatal("nothing was predicted: the test does not exercise predictions")
	}
}
