package kvindex

// table is an open-addressing hash set of entry indices with linear probing.
// The keys live in the entries themselves (byAux: entry.aux, else entry.key)
// or, for a key table value tagged recTag, in the key's holder record, so a
// slot costs 4 bytes plus one byte of displacement: how far the slot is from
// its value's home slot (saturating at dispMax). The displacement lets
// probes skip values of other homes and deletions shift values back without
// reading their entries, the cache misses that dominated both. 0 marks an
// empty slot (entry 0 is a sentinel).
type table struct {
	slots []uint32
	disp  []uint8
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
	if i := t.slot(s, h); i >= 0 {
		return t.slots[i]
	}
	return 0
}

// slot returns the slot index holding h, or -1.
func (t *table) slot(s *store, h uint64) int {
	if t.n == 0 {
		return -1
	}
	mask := uint64(len(t.slots) - 1)
	d := uint8(0)
	for i := mix(h) & mask; ; i = (i + 1) & mask {
		idx := t.slots[i]
		if idx == 0 {
			return -1
		}
		if t.disp[i] == d && t.keyOf(s, idx) == h {
			return int(i)
		}
		if d < dispMax {
			d++
		}
	}
}

// insert adds idx under h, which must not be present.
func (t *table) insert(s *store, h uint64, idx uint32) {
	if (t.n+1)*4 > len(t.slots)*3 {
		t.grow(s)
	}
	t.place(h, idx)
	t.n++
}

// place puts idx in the first free slot from h's home.
func (t *table) place(h uint64, idx uint32) {
	mask := uint64(len(t.slots) - 1)
	i := mix(h) & mask
	d := uint8(0)
	for t.slots[i] != 0 {
		i = (i + 1) & mask
		if d < dispMax {
			d++
		}
	}
	t.slots[i] = idx
	t.disp[i] = d
}

func (t *table) grow(s *store) {
	size := 16
	if len(t.slots) > 0 {
		size = len(t.slots) * 2
	}
	old := t.slots
	t.slots = make([]uint32, size)
	t.disp = make([]uint8, size)
	for _, idx := range old {
		if idx != 0 {
			t.place(t.keyOf(s, idx), idx)
		}
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
		var home int
		if d := t.disp[j]; d < dispMax {
			home = (j - int(d)) & mask
		} else {
			home = int(mix(t.keyOf(s, idx))) & mask
		}
		// Move idx into the hole at i unless its home lies cyclically in (i, j].
		if (i <= j && (home <= i || home > j)) || (i > j && home <= i && home > j) {
			t.slots[i] = idx
			t.disp[i] = uint8(min((i-home)&mask, dispMax))
			i = j
		}
	}
	t.slots[i] = 0
	t.disp[i] = 0
	t.n--
}

// reset empties the table, keeping small allocations.
func (t *table) reset() {
	if len(t.slots) > 1024 {
		t.slots, t.disp = nil, nil
	} else {
		clear(t.slots)
		clear(t.disp)
	}
	t.n = 0
}

func (t *table) bytes() int64 { return int64(cap(t.slots))*4 + int64(cap(t.disp)) }
