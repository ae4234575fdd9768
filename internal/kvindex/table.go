package kvindex

// table is an open-addressing hash set of entry indices with linear probing.
// The keys live in the entries themselves (byAux: entry.aux, else entry.key)
// or, for a key table value tagged recTag, in the key's holder record, so a
// slot costs 4 bytes. 0 marks an empty slot (entry 0 is a sentinel).
type table struct {
	slots []uint32
	n     int
	byAux bool
}

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

func (t *table) keyOf(s *store, idx uint32) uint64 {
	if t.byAux {
		return s.ents[idx].aux
	}
	if idx&recTag != 0 {
		return s.recs[int(idx&^recTag)*s.stride]
	}
	return uint64(s.ents[idx].key)
}

// find returns the entry index stored under h, or 0.
func (t *table) find(s *store, h uint64) uint32 {
	if t.n == 0 {
		return 0
	}
	mask := uint64(len(t.slots) - 1)
	for i := mix(h) & mask; ; i = (i + 1) & mask {
		idx := t.slots[i]
		if idx == 0 {
			return 0
		}
		if t.keyOf(s, idx) == h {
			return idx
		}
	}
}

// slot returns the slot index holding h, or -1.
func (t *table) slot(s *store, h uint64) int {
	if t.n == 0 {
		return -1
	}
	mask := uint64(len(t.slots) - 1)
	for i := mix(h) & mask; ; i = (i + 1) & mask {
		idx := t.slots[i]
		if idx == 0 {
			return -1
		}
		if t.keyOf(s, idx) == h {
			return int(i)
		}
	}
}

// insert adds idx under h, which must not be present.
func (t *table) insert(s *store, h uint64, idx uint32) {
	if (t.n+1)*4 > len(t.slots)*3 {
		t.grow(s)
	}
	mask := uint64(len(t.slots) - 1)
	i := mix(h) & mask
	for t.slots[i] != 0 {
		i = (i + 1) & mask
	}
	t.slots[i] = idx
	t.n++
}

func (t *table) grow(s *store) {
	size := 16
	if len(t.slots) > 0 {
		size = len(t.slots) * 2
	}
	old := t.slots
	t.slots = make([]uint32, size)
	mask := uint64(size - 1)
	for _, idx := range old {
		if idx == 0 {
			continue
		}
		i := mix(t.keyOf(s, idx)) & mask
		for t.slots[i] != 0 {
			i = (i + 1) & mask
		}
		t.slots[i] = idx
	}
}

// deleteSlot empties slot i, shifting later entries of its probe run back.
func (t *table) deleteSlot(s *store, i int) {
	mask := len(t.slots) - 1
	j := i
	for {
		j = (j + 1) & mask
		idx := t.slots[j]
		if idx == 0 {
			break
		}
		home := int(mix(t.keyOf(s, idx))) & mask
		// Move idx into the hole at i unless its home lies cyclically in (i, j].
		if (i <= j && (home <= i || home > j)) || (i > j && home <= i && home > j) {
			t.slots[i] = idx
			i = j
		}
	}
	t.slots[i] = 0
	t.n--
}

// reset empties the table, keeping small allocations.
func (t *table) reset() {
	if len(t.slots) > 1024 {
		t.slots = nil
	} else {
		clear(t.slots)
	}
	t.n = 0
}

func (t *table) bytes() int64 { return int64(cap(t.slots)) * 4 }
