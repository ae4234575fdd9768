package kvindex

// table is an open-addressing hash set of entry indices with linear probing.
// The keys live in the entries themselves (byAux: entry.aux, else entry.key)
// or, for a key table value tagged recTag, in the key's holder record, so a
// slot costs 4 bytes plus one byte of displacement, kept together so that a
// probe loads one cache line: how far the slot is from
// its value's home slot (saturating at dispMax). The displacement lets
// probes skip values of other homes and deletions shift values back without
// reading their entries, the cache misses that dominated both. 0 marks an
// empty slot (entry 0 is a sentinel).
type table struct {
	b     []byte // 5 bytes a slot: value (little endian), displacement
	n     int
	byAux bool
}

const dispMax = 255

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
func (t *table) dispAt(i int) uint8 { return t.b[5*i+4] }

// put replaces slot i's value by one of the same key.
func (t *table) put(i int, v uint32) {
	p := t.b[5*i : 5*i+4]
	p[0], p[1], p[2], p[3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
}

func (t *table) set(i int, v uint32, d uint8) {
	t.put(i, v)
	t.b[5*i+4] = d
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
	mask := uint64(t.size() - 1)
	d := uint8(0)
	for i := mix(h) & mask; ; i = (i + 1) & mask {
		idx := t.get(int(i))
		if idx == 0 {
			return -1
		}
		if t.dispAt(int(i)) == d && t.keyOf(s, idx) == h {
			return int(i)
		}
		if d < dispMax {
			d++
		}
	}
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
	i := mix(h) & mask
	d := uint8(0)
	for t.get(int(i)) != 0 {
		i = (i + 1) & mask
		if d < dispMax {
			d++
		}
	}
	t.set(int(i), idx, d)
}

func (t *table) grow(s *store) {
	size := 16
	if t.size() > 0 {
		size = t.size() * 2
	}
	old := *t
	t.b = make([]byte, 5*size)
	for i := range old.size() {
		if idx := old.get(i); idx != 0 {
			t.place(t.keyOf(s, idx), idx)
		}
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
			t.set(i, idx, uint8(min((i-home)&mask, dispMax)))
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
