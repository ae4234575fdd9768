package enginesim

import (
	"math/bits"

	"kvrouter/internal/vllm"
)

// hashSlot is one slot of a hashTable; v is the value plus one, so that the
// zero slot is empty.
type hashSlot struct {
	key vllm.BlockHash
	v   int32
}

// hashTable maps block hashes to non-negative int32 indexes (a block id, a
// CPU-tier entry): open addressing with linear probing and backward-shift
// deletion, so deletions leave no tombstones and probe lengths stay short
// under the pool's endless insert/delete churn (a Go map degrades there).
// Its capacity is fixed at construction: at least twice the most keys it
// will ever hold, which the block pool knows (one key per block at most).
type hashTable struct {
	slots []hashSlot
	mask  uint64
	shift uint
	n     int
}

// newHashTable returns a table for at most maxKeys keys, at a load factor
// of at most one half.
func newHashTable(maxKeys int) *hashTable {
	size := 16
	for size < 2*maxKeys {
		size *= 2
	}
	return &hashTable{
		slots: make([]hashSlot, size),
		mask:  uint64(size - 1),
		shift: uint(64 - bits.TrailingZeros(uint(size))),
	}
}

// home is the first slot probed for k (Fibonacci hashing: any hasher's
// digests spread, even non-random ones in tests).
func (t *hashTable) home(k vllm.BlockHash) uint64 {
	return (uint64(k) * 0x9e3779b97f4a7c15) >> t.shift
}

// get returns k's value, or -1.
func (t *hashTable) get(k vllm.BlockHash) int32 {
	for i := t.home(k); ; i = (i + 1) & t.mask {
		s := &t.slots[i]
		if s.v == 0 {
			return -1
		}
		if s.key == k {
			return s.v - 1
		}
	}
}

// set maps k to v (v >= 0), replacing any value. The caller keeps the key
// count within the capacity.
func (t *hashTable) set(k vllm.BlockHash, v int32) {
	for i := t.home(k); ; i = (i + 1) & t.mask {
		s := &t.slots[i]
		if s.v == 0 {
			s.key, s.v = k, v+1
			t.n++
			return
		}
		if s.key == k {
			s.v = v + 1
			return
		}
	}
}

// del removes k if present, shifting back the entries after it whose probe
// sequences passed its slot.
func (t *hashTable) del(k vllm.BlockHash) {
	i := t.home(k)
	for ; ; i = (i + 1) & t.mask {
		s := &t.slots[i]
		if s.v == 0 {
			return
		}
		if s.key == k {
			break
		}
	}
	t.n--
	for j := (i + 1) & t.mask; ; j = (j + 1) & t.mask {
		s := t.slots[j]
		if s.v == 0 {
			break
		}
		// Move s into the hole at i unless its home lies cyclically in
		// (i, j], where it is still reachable without passing i.
		if h := t.home(s.key); (j-h)&t.mask >= (j-i)&t.mask {
			t.slots[i] = s
			i = j
		}
	}
	t.slots[i] = hashSlot{}
}

// len is the number of keys held.
func (t *hashTable) len() int { return t.n }

// reset removes every key.
func (t *hashTable) reset() {
	clear(t.slots)
	t.n = 0
}
