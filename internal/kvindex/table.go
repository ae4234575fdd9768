package kvindex

import (
	"encoding/binary"
	"math/bits"
	"unsafe"
)

// table is an open-addressing hash set of entry indices. The keys live in
// the entries themselves (byAux: entry.aux, else entry.key) or, for a key
// table value tagged recTag, in the key's holder record, so a slot holds
// only a 4-byte value and a tag byte.
//
// Slots come in groups of groupSlots, one group per 64-byte cache line:
// the tags, an overflow count, the slots' away bits, then the values. A
// value's home group is the low bits of spread(key); it sits in the first
// group from its home (in order, wrapping) that had a free slot when it
// was placed. A group's overflow count is the number of values placed
// beyond it whose probe passed it (saturating at overMax, where it stays),
// so a probe that finds no match in a group with a zero count is over. A tag is a 7-bit
// fingerprint of the key with the high bit set (tagOf); 0 marks a free
// slot. A probe compares a group's tags in two word operations and loads
// only the entries behind matching tags (the key compare is a cache miss in
// a large index): a false match costs 1 in 128 values.
//
// Deleting a value frees its slot and decrements the overflow counts
// between its home and its group: no other value moves, and a deletion
// writes one cache line in nearly all cases. A slot's away bit says its
// value sits beyond its home group; a deletion of a value at home (nearly
// all of them) therefore neither loads the value's key nor hashes it.
//
// Slot indices are group<<slotShift | position; positions groupSlots and
// above are never used (get returns 0 there), so size() slots can be
// iterated as before.
type table struct {
	g     []group
	n     int
	byAux bool
}

// group is one cache line of slots.
type group struct {
	tags [groupSlots]uint8
	over uint8 // overflow count
	_    uint8
	away uint16 // bit p: slot p's value is not in its home group
	vals [groupSlots]uint32
}

var (
	_ [64 - unsafe.Sizeof(group{})]struct{}
	_ [unsafe.Sizeof(group{}) - 64]struct{}
)

const (
	groupSlots = 12
	slotShift  = 4
	overMax    = 255
	// maxLoad is the values a group may hold on average before the table
	// doubles (10 of 12 slots).
	maxLoad = 10
)

// tagOf returns the tag of a key whose spread is m: bits 57..63 of m, and
// the high bit.
func tagOf(m uint64) uint8 { return uint8(m>>56) | 0x80 }

// spread hashes a table key for its home group (low bits) and tag (high
// bits). Keys and engine hashes are hashes already, but engines, tests and
// traces also use small or structured integers: a multiply by 2^64/phi
// carries every bit of h into the product's high half, and folding that
// half onto the low one gives the home group bits that depend on all of
// h, in three instructions (the full finaliser mix takes eight).
func spread(h uint64) uint64 {
	m := h * 0x9e3779b97f4a7c15
	return m ^ m>>32
}

const (
	lsbs = 0x0101010101010101
	low7 = 0x7f7f7f7f7f7f7f7f
)

// zeroBytes returns w with bit 8k+7 set exactly where byte k of w is 0.
func zeroBytes(w uint64) uint64 { return ^((w&low7 + low7) | w | low7) }

// candidates returns w with bit 8k+7 set where byte k of w is 0, and
// possibly at some bytes above the lowest such byte (a borrow passing a
// 0x01 byte), in three operations on a probe's critical path: the lowest
// bit set is exact, a tag match above it is only a candidate, which the key
// compare settles.
func candidates(w uint64) uint64 { return (w - lsbs) &^ w & (lsbs << 7) }

// tagWords returns g's tags 0..7 and 8..11 (the high 4 bytes of the second
// word are the overflow count and padding: callers mask them with hiTags).
func (g *group) tagWords() (uint64, uint64) {
	return binary.LittleEndian.Uint64(g.tags[:8]), binary.LittleEndian.Uint64((*[16]byte)(unsafe.Pointer(g))[8:])
}

// hiTags masks the tag bytes of tagWords' second word in a zeroBytes mask.
const hiTags = 0x80808080

// size returns the number of slot indices (groups << slotShift).
func (t *table) size() int { return len(t.g) << slotShift }

// get returns slot i's value (0: free).
func (t *table) get(i int) uint32 {
	g := &t.g[i>>slotShift]
	if p := i & (1<<slotShift - 1); p < groupSlots {
		return g.vals[p]
	}
	return 0
}

// put replaces slot i's value by one of the same key.
func (t *table) put(i int, v uint32) { t.g[i>>slotShift].vals[i&(1<<slotShift-1)] = v }

// touch loads h's home group (a warm pass), returning a byte of it.
func (t *table) touch(h uint64) uint8 { return t.g[spread(h)&uint64(len(t.g)-1)].over }

func (t *table) keyOf(s *store, idx uint32) uint64 {
	if t.byAux {
		return s.ent(idx).aux
	}
	if idx&recTag != 0 {
		return s.recs[int(idx&^recTag)*s.stride]
	}
	return uint64(s.ent(idx).key)
}

// find returns the entry index stored under h, or 0.
func (t *table) find(s *store, h uint64) uint32 {
	_, v := t.lookup(s, h)
	return v
}

// slot returns the slot index holding h, or -1.
func (t *table) slot(s *store, h uint64) int {
	i, _ := t.lookup(s, h)
	return i
}

// lookup returns the slot holding h and its value, or -1 and 0. It is
// probe without the free-slot search, for lookups and removals.
func (t *table) lookup(s *store, h uint64) (int, uint32) {
	if t.n == 0 {
		return -1, 0
	}
	mask := uint64(len(t.g) - 1)
	m := spread(h)
	want := lsbs * uint64(tagOf(m))
	for gi := m & mask; ; gi = (gi + 1) & mask {
		g := &t.g[gi]
		w0, w1 := g.tagWords()
		for b := candidates(w0 ^ want); b != 0; b &= b - 1 {
			p := bits.TrailingZeros64(b) >> 3 & 7
			if v := g.vals[p]; t.keyOf(s, v) == h {
				return int(gi)<<slotShift | p, v
			}
		}
		for b := candidates(w1^want) & hiTags; b != 0; b &= b - 1 {
			p := 8 + bits.TrailingZeros64(b)>>3&3
			if v := g.vals[p]; t.keyOf(s, v) == h {
				return int(gi)<<slotShift | p, v
			}
		}
		if g.over == 0 {
			return -1, 0
		}
	}
}

// lookupHolder is lookup in the key table for the slot of key h, which
// entry idx holds: a slot whose value is idx itself is taken without
// loading its key.
func (t *table) lookupHolder(s *store, h uint64, idx uint32) (int, uint32) {
	if t.n == 0 {
		return -1, 0
	}
	mask := uint64(len(t.g) - 1)
	m := spread(h)
	want := lsbs * uint64(tagOf(m))
	for gi := m & mask; ; gi = (gi + 1) & mask {
		g := &t.g[gi]
		w0, w1 := g.tagWords()
		for b := candidates(w0 ^ want); b != 0; b &= b - 1 {
			p := bits.TrailingZeros64(b) >> 3 & 7
			if v := g.vals[p]; v == idx || t.keyOf(s, v) == h {
				return int(gi)<<slotShift | p, v
			}
		}
		for b := candidates(w1^want) & hiTags; b != 0; b &= b - 1 {
			p := 8 + bits.TrailingZeros64(b)>>3&3
			if v := g.vals[p]; v == idx || t.keyOf(s, v) == h {
				return int(gi)<<slotShift | p, v
			}
		}
		if g.over == 0 {
			return -1, 0
		}
	}
}

// probe looks h up: found, it returns h's slot; otherwise a free slot in
// the first group from h's home that has one, if the probe reached it (else
// -1), and spread(h), for insertAt.
func (t *table) probe(s *store, h uint64) (i int, m uint64, found bool) {
	m = spread(h)
	if len(t.g) == 0 {
		return -1, m, false
	}
	mask := uint64(len(t.g) - 1)
	want := lsbs * uint64(tagOf(m))
	free := -1
	for gi := m & mask; ; gi = (gi + 1) & mask {
		g := &t.g[gi]
		w0, w1 := g.tagWords()
		for b := candidates(w0 ^ want); b != 0; b &= b - 1 {
			p := bits.TrailingZeros64(b) >> 3 & 7
			if t.keyOf(s, g.vals[p]) == h {
				return int(gi)<<slotShift | p, m, true
			}
		}
		for b := candidates(w1^want) & hiTags; b != 0; b &= b - 1 {
			p := 8 + bits.TrailingZeros64(b)>>3&3
			if t.keyOf(s, g.vals[p]) == h {
				return int(gi)<<slotShift | p, m, true
			}
		}
		if free < 0 {
			if b := zeroBytes(w0); b != 0 {
				free = int(gi)<<slotShift | bits.TrailingZeros64(b)>>3
			} else if b := zeroBytes(w1) & hiTags; b != 0 {
				free = int(gi)<<slotShift | 8 + bits.TrailingZeros64(b)>>3
			}
		}
		if g.over == 0 {
			return free, m, false
		}
	}
}

// insertAt adds idx under a key of spread m, which must not be present, at
// the free slot i that probe returned with m, unless the table must grow
// first (or i < 0): then it places it anew.
func (t *table) insertAt(s *store, m uint64, i int, idx uint32) {
	if i < 0 || t.n >= len(t.g)*maxLoad {
		t.insert(s, m, idx)
		return
	}
	gi, p := i>>slotShift, i&(1<<slotShift-1)
	g := &t.g[gi]
	g.tags[p] = tagOf(m)
	g.vals[p] = idx
	t.n++
	mask := len(t.g) - 1
	if home := int(m) & mask; home != gi {
		g.away |= 1 << p
		for j := home; j != gi; j = (j + 1) & mask {
			if t.g[j].over < overMax {
				t.g[j].over++
			}
		}
	}
}

// insert adds idx under a key of spread m, which must not be present.
func (t *table) insert(s *store, m uint64, idx uint32) {
	if t.n+1 > len(t.g)*maxLoad {
		t.grow(s)
	}
	t.place(m, idx)
	t.n++
}

// place puts idx, of a key of spread m, in the first free slot from its
// home group.
func (t *table) place(m uint64, idx uint32) {
	mask := uint64(len(t.g) - 1)
	away := uint16(0)
	for gi := m & mask; ; gi = (gi + 1) & mask {
		g := &t.g[gi]
		w0, w1 := g.tagWords()
		p := -1
		if b := zeroBytes(w0); b != 0 {
			p = bits.TrailingZeros64(b) >> 3
		} else if b := zeroBytes(w1) & hiTags; b != 0 {
			p = 8 + bits.TrailingZeros64(b)>>3
		}
		if p >= 0 {
			g.tags[p], g.vals[p] = tagOf(m), idx
			g.away |= away << p
			return
		}
		if g.over < overMax {
			g.over++
		}
		away = 1
	}
}

func (t *table) grow(s *store) {
	t.rehash(s, max(1, 2*len(t.g)))
}

// rehash moves the values into a table of groups groups (a power of two
// that holds them). Finding a value's key loads its entry or record, a
// cache miss in a large index; the keys of rehashBatch values are loaded in
// a loop of independent loads before they are placed, so that the processor
// overlaps those misses instead of taking them one after another.
func (t *table) rehash(s *store, groups int) {
	old := *t
	t.g = make([]group, groups)
	var idxs [rehashBatch]uint32
	var hs [rehashBatch]uint64
	for i := 0; i < old.size(); {
		n := 0
		for ; i < old.size() && n < rehashBatch; i++ {
			if idx := old.get(i); idx != 0 {
				idxs[n] = idx
				n++
			}
		}
		for k := range n {
			hs[k] = spread(t.keyOf(s, idxs[k]))
		}
		for k := range n {
			t.place(hs[k], idxs[k])
		}
	}
}

// rehashBatch is the number of keys rehash loads before placing them.
const rehashBatch = 64

// reserve sizes the table for n values without growing: the smallest power
// of two of groups that holds n at the maximum load, unless it is that large
// already; present values are rehashed.
func (t *table) reserve(s *store, n int) {
	groups := 1
	for n > groups*maxLoad {
		groups *= 2
	}
	if groups > len(t.g) {
		t.rehash(s, groups)
	}
}

// deleteSlot frees slot i and, when its value is away from its home group,
// takes it out of the overflow counts of the groups before it from its
// home. No other value moves.
func (t *table) deleteSlot(s *store, i int) {
	gi, p := i>>slotShift, i&(1<<slotShift-1)
	g := &t.g[gi]
	v := g.vals[p]
	g.tags[p], g.vals[p] = 0, 0
	t.n--
	if g.away&(1<<p) == 0 {
		return
	}
	g.away &^= 1 << p
	mask := len(t.g) - 1
	for j := int(spread(t.keyOf(s, v))) & mask; j != gi; j = (j + 1) & mask {
		if t.g[j].over < overMax {
			t.g[j].over--
		}
	}
}

// reset empties the table, keeping small allocations.
func (t *table) reset() {
	if len(t.g) > 16 {
		t.g = nil
	} else {
		clear(t.g)
	}
	t.n = 0
}

func (t *table) bytes() int64 { return int64(cap(t.g)) * int64(unsafe.Sizeof(group{})) }
