package tokenizer

import "math/bits"

// Merging one word. Symbols form a linked list over the word's bytes; the
// lowest-ranked adjacent pair merges first, leftmost first among equal
// ranks, exactly as Hugging Face's Word::merge_all does without dropout.
// Short words keep each pair's rank in an array and scan it for the best
// (O(n^2) compares but O(n) table lookups, no heap); longer ones keep a
// binary heap of candidate pairs, so a word of n bytes costs O(n log n)
// however it merges.

// linearMergeMax is the longest word merged by scanning.
const linearMergeMax = 64

// noRank marks a pair that does not merge.
const noRank = ^uint32(0)

// scratch is per-call working memory, pooled by the Tokenizer.
type scratch struct {
	sym    []symbol
	heap   []uint64
	pieces []string
	segs   []segment  // encodeCached's segments of its text
	front  frontCache // reset before the scratch is pooled again
}

type symbol struct {
	id         uint32
	rank       uint32 // linear merge: rank of (this, next), or noRank
	mergeID    uint32 // linear merge: id that pair merges into
	prev, next int32  // -1 at the ends; a merged-away symbol has prev == -2
}

// mergeTable maps a pair of ids to its merge: open addressing with linear
// probing over a power-of-two table at most half full, several times
// faster than a Go map for this hot lookup.
type mergeTable struct {
	keys  []uint64 // pairKey, or emptyKey
	vals  []merge
	shift uint
}

const emptyKey = ^uint64(0)

func newMergeTable(n int) mergeTable {
	size := 1 << bits.Len(uint(2*n+1))
	t := mergeTable{keys: make([]uint64, size), vals: make([]merge, size), shift: uint(64 - bits.Len(uint(size-1)))}
	for i := range t.keys {
		t.keys[i] = emptyKey
	}
	return t
}

func (t *mergeTable) slot(k uint64) int {
	return int((k * 0x9E3779B97F4A7C15) >> t.shift)
}

// put inserts or overwrites.
func (t *mergeTable) put(k uint64, m merge) {
	mask := len(t.keys) - 1
	for i := t.slot(k); ; i = (i + 1) & mask {
		if t.keys[i] == emptyKey || t.keys[i] == k {
			t.keys[i], t.vals[i] = k, m
			return
		}
	}
}

func (t *mergeTable) get(a, b uint32) (merge, bool) {
	k := pairKey(a, b)
	mask := len(t.keys) - 1
	for i := t.slot(k); ; i = (i + 1) & mask {
		switch t.keys[i] {
		case k:
			return t.vals[i], true
		case emptyKey:
			return merge{}, false
		}
	}
}

func (b *bpe) mergeWord(dst []uint32, w string, sc *scratch) []uint32 {
	n := len(w)
	sym := sc.sym[:0]
	for i := 0; i < n; i++ {
		sym = append(sym, symbol{id: b.byteID[w[i]], prev: int32(i - 1), next: int32(i + 1)})
	}
	sym[n-1].next = -1
	sc.sym = sym
	if n <= linearMergeMax {
		b.mergeLinear(sym)
	} else {
		b.mergeHeap(sym, sc)
	}
	for i := int32(0); i >= 0; i = sym[i].next {
		dst = append(dst, sym[i].id)
	}
	return dst
}

// rankPair records in sym[i] the merge of sym[i] with its successor.
func (b *bpe) rankPair(sym []symbol, i int32) {
	j := sym[i].next
	if j < 0 {
		sym[i].rank = noRank
		return
	}
	if m, ok := b.merges.get(sym[i].id, sym[j].id); ok {
		sym[i].rank, sym[i].mergeID = m.rank, m.id
	} else {
		sym[i].rank = noRank
	}
}

// mergeLinear scans the pair ranks for the lowest (leftmost on ties).
func (b *bpe) mergeLinear(sym []symbol) {
	for i := int32(0); i >= 0; i = sym[i].next {
		b.rankPair(sym, i)
	}
	for {
		best, at := noRank, int32(-1)
		for i := int32(0); i >= 0; i = sym[i].next {
			if sym[i].rank < best {
				best, at = sym[i].rank, i
			}
		}
		if at < 0 {
			return
		}
		b.apply(sym, at, sym[at].mergeID)
		b.rankPair(sym, at)
		if p := sym[at].prev; p >= 0 {
			b.rankPair(sym, p)
		}
	}
}

// apply merges the symbol at i with its successor into id.
func (b *bpe) apply(sym []symbol, i int32, id uint32) {
	j := sym[i].next
	sym[i].id = id
	sym[i].next = sym[j].next
	if k := sym[j].next; k >= 0 {
		sym[k].prev = i
	}
	sym[j].prev = -2
}

func (b *bpe) mergeHeap(sym []symbol, sc *scratch) {
	// Heap entries pack rank<<32 | pos, so ordering is one compare: lowest
	// rank, then leftmost. An entry is stale when the pair at pos no longer
	// has that rank (ranks are unique per pair).
	h := sc.heap[:0]
	consider := func(i int32) {
		if i < 0 {
			return
		}
		j := sym[i].next
		if j < 0 {
			return
		}
		if m, ok := b.merges.get(sym[i].id, sym[j].id); ok {
			h = heapPush(h, uint64(m.rank)<<32|uint64(i))
		}
	}
	for i := int32(0); i >= 0; i = sym[i].next {
		consider(i)
	}
	for len(h) > 0 {
		var c uint64
		c, h = heapPop(h)
		i, rank := int32(uint32(c)), uint32(c>>32)
		if sym[i].prev == -2 {
			continue
		}
		j := sym[i].next
		if j < 0 {
			continue
		}
		m, ok := b.merges.get(sym[i].id, sym[j].id)
		if !ok || m.rank != rank {
			continue
		}
		b.apply(sym, i, m.id)
		consider(sym[i].prev)
		consider(i)
	}
	sc.heap = h
}

func heapPush(h []uint64, c uint64) []uint64 {
	h = append(h, c)
	for k := len(h) - 1; k > 0; {
		p := (k - 1) / 2
		if h[k] >= h[p] {
			break
		}
		h[k], h[p] = h[p], h[k]
		k = p
	}
	return h
}

func heapPop(h []uint64) (uint64, []uint64) {
	top := h[0]
	last := len(h) - 1
	h[0] = h[last]
	h = h[:last]
	n := len(h)
	for k := 0; ; {
		l := 2*k + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && h[r] < h[l] {
			m = r
		}
		if h[m] >= h[k] {
			break
		}
		h[k], h[m] = h[m], h[k]
		k = m
	}
	return top, h
}
