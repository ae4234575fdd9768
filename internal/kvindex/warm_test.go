package kvindex

import (
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
	hs0, toks0 := chain(0)
	var evs []vllm.Event
	for j := per - 1; j >= 0; j-- {
		evs = append(evs, removedEv("", hs0[j]))
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
	if s.Removed-before.Removed != per || s.UnknownRemoved-before.UnknownRemoved != 2 || s.Entries != before.Entries {
		t.Fatalf("removed %d, unknown %d, entries %d -> %d", s.Removed-before.Removed,
			s.UnknownRemoved-before.UnknownRemoved, before.Entries, s.Entries)
	}
	if m := lookupOf(x, "e", toks0, Extras{}); m.Blocks() != 0 {
		t.Errorf("removed chain: %+v", m)
	}
	if m := lookupOf(x, "e", toksN, Extras{}); m.GPU != per {
		t.Errorf("stored chain: %+v", m)
	}
	_, toks1 := chain(1)
	if m := lookupOf(x, "e", toks1, Extras{}); m.GPU != per {
		t.Errorf("untouched chain: %+v", m)
	}
}
