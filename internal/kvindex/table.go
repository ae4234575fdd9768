package kvindex

// table is an open-addressing hash set of entry indices with linear probing.
// The keys live in the entries themselves (byAux: entry.aux, else entry.key)
// or, for a key table value tagged recTag, in the key's holder record, so a
// slot costs 4 bytes plus one tag byte, kept together so that a probe loads
// one cache line. The tag's low 4 bits are the displacement: how far the
// slot is from its value's home slot (saturating at dispMax); its high 4 bits
// are a fingerprint of the hashed value (fpOf). The displacement lets probes
// skip values of other homes and deletions shift values back without reading
// their entries; the fingerprint lets probes skip 15 in 16 values of the same
// home without loading their entries (the key compare is a cache miss in a
// large index). 0 marks an empty slot (entry 0 is a sentinel).
type table struct {
	b     []byte // 5 bytes a slot: value (little endian), displacement
	n     int
	byAux bool
}

// dispMax is the saturated displacement: a slot this far or farther from its
// home says so, and deletion reads its key to find the home.
const dispMax = 15

// fpOf returns h's fingerprint, in the tag byte's high 4 bits: bits 60..63
// of mix(h), which the home slot (low bits) does not use.
func fpOf(m uint64) uint8 { return uint8(m>>56) & 0xf0 }

// mix spreads a 64-bit value over the slot range (keys and engine hashes are
// hashes already, but tests and traces use small integers).
func mix(h uint64) uint64 {
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}

// size returns the number of slots.
func (t *table) size() int { return len(t.b) / 5 }

// get returns slot i's value (0: empty).
func (t *table) get(i int) uint32 {
	p := t.b[5*i : 5*i+4]
	return uint32(p[0]) | uint32(p[1])<<8 | uint32(p[2])<<16 | uint32(p[3])<<24
}

// dispAt returns slot i's displacement.
func (t *table) dispAt(i int) uint8 { return t.b[5*i+4] & dispMax }

// tagAt returns slot i's tag byte: fingerprint | displacement.
func (t *table) tagAt(i int) uint8 { return t.b[5*i+4] }

// put replaces slot i's value by one of the same key.
func (t *table) put(i int, v uint32) {
	p := t.b[5*i : 5*i+4]
	p[0], p[1], p[2], p[3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
}

// set writes slot i's value and tag byte.
func (t *table) set(i int, v uint32, tag uint8) {
	t.put(i, v)
	t.b[5*i+4] = tag
}

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
	if i := t.slot(s, h); i >= 0 {
		return t.get(i)
	}
	return 0
}

// slot returns the slot index holding h, or -1.
func (t *table) slot(s *store, h uint64) int {
	if t.n == 0 {
		return -1
	}
	if i, _, found := t.probe(s, h); found {
		return i
	}
	return -1
}

// probe looks h up: found, it returns h's slot; otherwise the empty slot
// where the probe ended, and the tag a value of h placed there gets (-1 when
// the table has no slots), for insertAt.
func (t *table) probe(s *store, h uint64) (i int, tag uint8, found bool) {
	if t.size() == 0 {
		return -1, 0, false
	}
	mask := uint64(t.size() - 1)
	m := mix(h)
	fp := fpOf(m)
	d := uint8(0)
	for j := m & mask; ; j = (j + 1) & mask {
		idx := t.get(int(j))
		if idx == 0 {
			return int(j), fp | d, false
		}
		if t.tagAt(int(j)) == fp|d && t.keyOf(s, idx) == h {
			return int(j), 0, true
		}
		if d < dispMax {
			d++
		}
	}
}

// insertAt adds idx under h, which must not be present, at the empty slot i
// with tag that probe returned, unless the table must grow first (or i < 0):
// then it probes again.
func (t *table) insertAt(s *store, h uint64, i int, tag uint8, idx uint32) {
	if i < 0 || (t.n+1)*4 > t.size()*3 {
		t.insert(s, h, idx)
		return
	}
	t.set(i, idx, tag)
	t.n++
}

// insert adds idx under h, which must not be present.
func (t *table) insert(s *store, h uint64, idx uint32) {
	if (t.n+1)*4 > t.size()*3 {
		t.grow(s)
	}
	t.place(h, idx)
	t.n++
}

// place puts idx in the first free slot from h's home.
func (t *table) place(h uint64, idx uint32) {
	mask := uint64(t.size() - 1)
	m := mix(h)
	i := m & mask
	d := uint8(0)
	for t.get(int(i)) != 0 {
		i = (i + 1) & mask
		if d < dispMax {
			d++
		}
	}
	t.set(int(i), idx, fpOf(m)|d)
}

func (t *table) grow(s *store) {
	size := 16
	if t.size() > 0 {
		size = t.size() * 2
	}
	t.rehash(s, size)
}

// rehash moves the values into a table of size slots (a power of two that
// holds them). Finding a value's key loads its entry or record, a cache
// miss in a large index; the keys of rehashBatch values are loaded in a
// loop of independent loads before they are placed, so that the processor
// overlaps those misses instead of taking them one after another.
func (t *table) rehash(s *store, size int) {
	old := *t
	t.b = make([]byte, 5*size)
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
			hs[k] = t.keyOf(s, idxs[k])
		}
		for k := range n {
			t.place(hs[k], idxs[k])
		}
	}
}

// rehashBatch is the number of keys rehash loads before placing them.
const rehashBatch = 64

// reserve sizes the table for n values without growing: the smallest power
// of two of at least 16 slots that holds n at a load of at most 3/4, unless
// it is that large already; present values are rehashed.
func (t *table) reserve(s *store, n int) {
	size := 16
	for n*4 > size*3 {
		size *= 2
	}
	if size > t.size() {
		t.rehash(s, size)
	}
}

// deleteSlot empties slot i, shifting later entries of its probe run back.
func (t *table) deleteSlot(s *store, i int) {
	mask := t.size() - 1
	j := i
	for {
		j = (j + 1) & mask
		idx := t.get(j)
		if idx == 0 {
			break
		}
		var home int
		if d := t.dispAt(j); d < dispMax {
			home = (j - int(d)) & mask
		} else {
			home = int(mix(t.keyOf(s, idx))) & mask
		}
		// Move idx into the hole at i unless its home lies cyclically in (i, j].
		if (i <= j && (home <= i || home > j)) || (i > j && home <= i && home > j) {
			t.set(i, idx, t.tagAt(j)&^dispMax|uint8(min((i-home)&mask, dispMax)))
			i = j
		}
	}
	t.set(i, 0, 0)
	t.n--
}

// reset empties the table, keeping small allocations.
func (t *table) reset() {
	if t.size() > 1024 {
		t.b = nil
	} else {
		clear(t.b)
	}
	t.n = 0
}

func (t *table) bytes() int64 { return int64(cap(t.b)) }
