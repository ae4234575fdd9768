package tokenizer

import (
	"hash/maphash"
	"slices"
)

// The tokenizer's tables live as long as the process, and the garbage
// collector marks what they point to on every cycle: a table of 150,000
// separately allocated strings costs it 150,000 cache misses a cycle, a
// few milliseconds of CPU for every few dozen megabytes the router
// allocates. The types here keep a vocabulary in a handful of arrays that
// hold no pointers.

// byteTable is a list of byte strings kept in one array: entry i is
// bytes[end[i-1]:end[i]] (from 0 for entry 0). The zero value is empty.
type byteTable struct {
	bytes []byte
	end   []uint32
}

// add appends s as the next entry.
func (t *byteTable) add(s string) {
	t.bytes = append(t.bytes, s...)
	t.end = append(t.end, uint32(len(t.bytes)))
}

// clip returns t with its arrays' spare capacity released.
func (t *byteTable) clip() byteTable {
	return byteTable{bytes: slices.Clip(t.bytes), end: slices.Clip(t.end)}
}

// len is the number of entries.
func (t *byteTable) len() int { return len(t.end) }

// at returns entry i (i < len), aliasing the table: not to be modified.
func (t *byteTable) at(i uint32) []byte {
	start := uint32(0)
	if i > 0 {
		start = t.end[i-1]
	}
	return t.bytes[start:t.end[i]]
}

// vocabIndex maps a vocabulary entry's bytes to its id exactly. Entries are
// found by a 64-bit hash of their bytes and confirmed against the stored
// bytes; the rare entry whose hash an earlier one already has goes in
// clash. Only clash holds pointers.
type vocabIndex struct {
	seed   maphash.Seed
	keys   byteTable
	ids    []uint32
	byHash map[uint64]uint32 // hash -> entry
	clash  map[string]uint32 // bytes -> id, for entries whose hash is taken
}

// newVocabIndex indexes keys[i] -> ids[i]; keys are distinct.
func newVocabIndex(keys []string, ids []uint32) *vocabIndex {
	v := &vocabIndex{seed: maphash.MakeSeed(), ids: slices.Clone(ids),
		byHash: make(map[uint64]uint32, len(keys))}
	for i, k := range keys {
		v.keys.add(k)
		h := maphash.String(v.seed, k)
		if _, taken := v.byHash[h]; taken {
			if v.clash == nil {
				v.clash = map[string]uint32{}
			}
			v.clash[k] = ids[i]
			continue
		}
		v.byHash[h] = uint32(i)
	}
	v.keys = v.keys.clip()
	return v
}

// get returns w's id, or false when w is not an entry.
func (v *vocabIndex) get(w string) (uint32, bool) {
	if i, ok := v.byHash[maphash.String(v.seed, w)]; ok && string(v.keys.at(i)) == w {
		return v.ids[i], true
	}
	if v.clash != nil {
		id, ok := v.clash[w]
		return id, ok
	}
	return 0, false
}
