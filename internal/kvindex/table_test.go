package kvindex

import (
	"math/rand/v2"
	"testing"
)

// TestTableCollidingHomes fills a source table with 300 engine hashes that
// share one home group (so they overflow across many groups) among random
// ones, deletes in random order and checks that every remaining hash is
// found, every deleted one is not, and the overflow counts stay exact.
func TestTableCollidingHomes(t *testing.T) {
	const mask = 4095 // homes equal under 4096 groups are equal under fewer
	var hs []uint64
	home := spread(1) & mask
	for h := uint64(1); len(hs) < 300; h++ {
		if spread(h)&mask == home {
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
	if far := farthest(&st, &st.srcs[src].tab); far < 300/groupSlots-1 {
		t.Fatalf("farthest value %d groups from its home; the colliding hashes no longer share a home", far)
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
			checkTable(t, &st, &st.srcs[src].tab)
			checkTable(t, &st, &st.keys)
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

// TestTableChurn churns a source table at 300 to 360 hashes (random stores
// and removals) and checks against a map that every live hash is found and
// no removed one is, that the overflow counts stay exact, and that the
// table stays at the size its values need.
func TestTableChurn(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	st := newStore(false, true, true)
	src := st.addSource(0, 0, 0)
	tab := &st.srcs[src].tab
	live := map[uint64]uint32{}
	var order []uint64
	maxSize := 0
	for step := range 200_000 {
		if len(order) < 300 || rng.IntN(2) == 0 && len(order) < 360 {
			h := rng.Uint64()
			if _, ok := live[h]; ok {
				continue
			}
			live[h] = st.insert(src, Key(h), h, 0)
			order = append(order, h)
		} else {
			k := rng.IntN(len(order))
			h := order[k]
			order[k] = order[len(order)-1]
			order = order[:len(order)-1]
			if got := st.find(src, h); got != live[h] {
				t.Fatalf("step %d: hash %x found as entry %d, want %d", step, h, got, live[h])
			}
			st.remove(live[h])
			delete(live, h)
			if st.find(src, h) != 0 {
				t.Fatalf("step %d: removed hash %x still found", step, h)
			}
		}
		maxSize = max(maxSize, len(tab.g))
		if step%997 == 0 {
			checkTable(t, &st, tab)
			checkTable(t, &st, &st.keys)
			for h, idx := range live {
				if got := st.find(src, h); got != idx {
					t.Fatalf("step %d: hash %x found as entry %d, want %d", step, h, got, idx)
				}
			}
		}
	}
	// 360 values fit 64 groups at the maximum load.
	if maxSize > 64 {
		t.Fatalf("table grew to %d groups for at most 360 values", maxSize)
	}
}

// farthest returns the largest distance in groups of a value of tab from
// its home group.
func farthest(st *store, tab *table) int {
	mask := len(tab.g) - 1
	far := 0
	for i := range tab.size() {
		if v := tab.get(i); v != 0 {
			home := int(spread(tab.keyOf(st, v))) & mask
			far = max(far, (i>>slotShift-home)&mask)
		}
	}
	return far
}

// checkTable checks tab's value count, tags and overflow counts against its
// slots.
func checkTable(t *testing.T, st *store, tab *table) {
	t.Helper()
	n := 0
	mask := len(tab.g) - 1
	over := make([]int, len(tab.g))
	for i := range tab.size() {
		gi, p := i>>slotShift, i&(1<<slotShift-1)
		if p >= groupSlots {
			continue
		}
		v, tag := tab.g[gi].vals[p], tab.g[gi].tags[p]
		if v == 0 {
			if tab.g[gi].away>>p&1 != 0 {
				t.Fatalf("slot %d: no value, away bit set", i)
			}
			if tag != 0 {
				t.Fatalf("slot %d: no value, tag %#x", i, tag)
			}
			continue
		}
		n++
		m := spread(tab.keyOf(st, v))
		if tag != tagOf(m) {
			t.Fatalf("slot %d: tag %#x, want %#x", i, tag, tagOf(m))
		}
		if away := tab.g[gi].away>>p&1 == 1; away != (int(m)&mask != gi) {
			t.Fatalf("slot %d: away bit %v, home group %d, group %d", i, away, int(m)&mask, gi)
		}
		for j := int(m) & mask; j != gi; j = (j + 1) & mask {
			over[j]++
		}
	}
	if n != tab.n {
		t.Fatalf("table counts %d values; slots hold %d", tab.n, n)
	}
	for gi := range tab.g {
		if got := int(tab.g[gi].over); got != min(over[gi], overMax) && got != overMax {
			t.Fatalf("group %d: overflow count %d, want %d", gi, got, over[gi])
		}
	}
}
