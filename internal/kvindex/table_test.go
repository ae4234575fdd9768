package kvindex

import (
	"math/rand/v2"
	"testing"
)

// TestTableCollidingHomes fills a source table with 300 engine hashes that
// share one home slot (displacements reaching dispMax, so the saturated path
// reads entries) among random ones, deletes in random order and checks that
// every remaining hash is found and every deleted one is not.
func TestTableCollidingHomes(t *testing.T) {
	const mask = 4095 // homes equal under 4096 slots are equal under fewer
	var hs []uint64
	home := mix(1) & mask
	for h := uint64(1); len(hs) < 300; h++ {
		if mix(h)&mask == home {
			hs = append(hs, h)
		}
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for range 400 {
		hs = append(hs, rng.Uint64())
	}
	rng.Shuffle(len(hs), func(i, j int) { hs[i], hs[j] = hs[j], hs[i] })
	st := newStore(false, true, true)
	src := st.addSource(0, 0, 0)
	for i, h := range hs {
		st.insert(src, Key(i+1), h, 0)
	}
	if st.srcs[src].tab.size() > mask+1 {
		t.Fatalf("table grew to %d slots; the colliding hashes no longer share a home", st.srcs[src].tab.size())
	}
	saturated := false
	for i := range st.srcs[src].tab.size() {
		saturated = saturated || st.srcs[src].tab.dispAt(i) == dispMax
	}
	if !saturated {
		t.Fatal("no displacement reached dispMax")
	}
	live := map[uint64]bool{}
	for _, h := range hs {
		live[h] = true
	}
	for n, h := range hs {
		idx := st.find(src, h)
		if idx == 0 {
			t.Fatalf("hash %x lost after %d deletions", h, n)
		}
		st.remove(idx)
		delete(live, h)
		if n%50 == 0 || n > len(hs)-20 {
			for g := range live {
				if st.find(src, g) == 0 {
					t.Fatalf("after deleting %d hashes: %x not found", n+1, g)
				}
			}
			if st.find(src, h) != 0 {
				t.Fatalf("deleted hash %x still found", h)
			}
		}
	}
	if st.n != 0 || st.srcs[src].tab.n != 0 || st.keys.n != 0 {
		t.Fatalf("store not empty: %d entries, %d slots, %d keys", st.n, st.srcs[src].tab.n, st.keys.n)
	}
}
