package kvindex

import (
	"math/rand/v2"
	"slices"
	"testing"

	"kvrouter/internal/vllm"
)

// TestWarmLargeIndex applies batches to an index past warmMin entries, so
// that the warm passes run, with removals of known and unknown hashes, of an
// unknown group, and a store, and checks the outcome is exact.
func TestWarmLargeIndex(t *testing.T) {
	const bs, per = 4, 32
	chains := warmMin/per + 64
	x := testExact(newClock(), func(c *Config) { c.PredictTTL = -1 })
	chain := func(c int) ([]uint64, []uint32) {
		hs := make([]uint64, per)
		for j := range hs {
			hs[j] = uint64(c*per + j + 1)
		}
		return hs, seq(c*per*bs+1_000_000, per*bs)
	}
	for c := range chains {
		hs, toks := chain(c)
		x.Apply("e", batch(0, storedEv(nil, hs, toks, "")))
	}
	if n := x.Stats().Entries; n < warmMin {
		t.Fatalf("%d entries: below warmMin, the passes would not run", n)
	}
	hs0, _ := chain(0)
	var evs []vllm.Event
	// Chains 0, 2 and 3: more removals than one warmChunk window.
	gone := []int{0, 2, 3}
	for _, c := range gone {
		hs, _ := chain(c)
		for j := per - 1; j >= 0; j-- {
			evs = append(evs, removedEv("", hs[j]))
		}
	}
	if len(gone)*per <= warmChunk {
		t.Fatalf("%d removals fit one warm window of %d", len(gone)*per, warmChunk)
	}
	evs = append(evs, removedEv("", 1<<40))
	g := 7
	other := removedEv("", hs0[0])
	other.GroupIdx = &g
	evs = append(evs, other)
	hsN, toksN := chain(chains)
	evs = append(evs, storedEv(nil, hsN, toksN, ""))
	before := x.Stats()
	x.Apply("e", batch(0, evs...))
	s := x.Stats()
	if s.Removed-before.Removed != int64(len(gone)*per) || s.UnknownRemoved-before.UnknownRemoved != 2 ||
		s.Entries != before.Entries-int64((len(gone)-1)*per) {
		t.Fatalf("removed %d, unknown %d, entries %d -> %d", s.Removed-before.Removed,
			s.UnknownRemoved-before.UnknownRemoved, before.Entries, s.Entries)
	}
	for _, c := range gone {
		_, toks := chain(c)
		if m := lookupOf(x, "e", toks, Extras{}); m.Blocks() != 0 {
			t.Errorf("removed chain %d: %+v", c, m)
		}
	}
	if m := lookupOf(x, "e", toksN, Extras{}); m.GPU != per {
		t.Errorf("stored chain: %+v", m)
	}
	_, toks1 := chain(1)
	if m := lookupOf(x, "e", toks1, Extras{}); m.GPU != per {
		t.Errorf("untouched chain: %+v", m)
	}
}

// TestWarmMatchesCold applies the same random batches to an index that
// always runs the warm passes (and so reuses the removal slots they found)
// and to one that never does: stores, removals of held, unknown and
// repeated hashes, a hash removed and stored again in one batch, clears.
// Counters and every lookup must agree after every batch.
func TestWarmMatchesCold(t *testing.T) {
	const bs, chains, per = 4, 24, 12
	warm := testExact(newClock(), func(c *Config) { c.PredictTTL = -1 })
	cold := testExact(newClock(), func(c *Config) { c.PredictTTL = -1 })
	warm.warmFrom, cold.warmFrom = 0, 1<<62
	rng := rand.New(rand.NewPCG(7, 7))
	engines := []string{"e0", "e1", "e2"}
	hash := func(e, c, j int) uint64 { return uint64(e*100_000 + c*per + j + 1) }
	toks := func(c int) []uint32 { return seq(c*per*bs+5_000, per*bs) }
	for step := range 3000 {
		e := rng.IntN(len(engines))
		var evs []vllm.Event
		for range 1 + rng.IntN(6) {
			c := rng.IntN(chains)
			switch op := rng.IntN(10); {
			case op < 4: // store a prefix of chain c
				n := 1 + rng.IntN(per)
				hs := make([]uint64, n)
				for j := range hs {
					hs[j] = hash(e, c, j)
				}
				evs = append(evs, storedEv(nil, hs, toks(c)[:n*bs], ""))
			case op < 9: // remove blocks, some unknown, some twice
				var hs []uint64
				for range 1 + rng.IntN(per) {
					hs = append(hs, hash(e, c, rng.IntN(per+2)))
				}
				evs = append(evs, removedEv("", hs...))
			default:
				if rng.IntN(20) == 0 {
					evs = append(evs, vllm.Event{Type: vllm.AllBlocksCleared})
				}
			}
		}
		b := batch(0, evs...)
		warm.Apply(engines[e], b)
		cold.Apply(engines[e], b)
		sw, sc := warm.Stats(), cold.Stats()
		sw.Bytes, sc.Bytes = 0, 0
		if sw != sc {
			t.Fatalf("step %d: warm %+v, cold %+v", step, sw, sc)
		}
		for c := range chains {
			a, b := warm.Lookup(Keys(nil, toks(c), bs, Extras{Root: warm.Root()}), nil), cold.Lookup(Keys(nil, toks(c), bs, Extras{Root: cold.Root()}), nil)
			if !slices.Equal(a, b) {
				t.Fatalf("step %d chain %d: warm %+v, cold %+v", step, c, a, b)
			}
		}
	}
	if s := warm.Stats(); s.Removed == 0 || s.UnknownRemoved == 0 || s.Stored == 0 || s.Cleared == 0 {
		t.Fatalf("the test exercised too little: %+v", s)
	}
}

// TestWarmSlotAfterClear: a batch that clears an engine's blocks (its
// source table dropped, then reused small by a store), then removes a hash
// the warm pass had found in the big table, applies without reading a slot
// of the old table (it panicked) and removes nothing that is not there.
func TestWarmSlotAfterClear(t *testing.T) {
	x := testExact(newClock(), func(c *Config) { c.PredictTTL = -1 })
	x.warmFrom = 0
	hs := make([]uint64, 2000)
	for i := range hs {
		hs[i] = uint64(i + 1)
	}
	x.Apply("e", batch(0, storedEv(nil, hs, seq(0, 4*len(hs)), "")))
	x.Apply("e", batch(0,
		vllm.Event{Type: vllm.AllBlocksCleared},
		storedEv(nil, []uint64{1 << 40}, seq(1<<20, 4), ""),
		removedEv("", hs[1500], hs[1999]),
	))
	s := x.Stats()
	if s.Entries != 1 || s.Cleared != 2000 || s.UnknownRemoved != 2 {
		t.Fatalf("after clear, store, removals: %+v", s)
	}
}
