package tokenizer

// Merging one word. Symbols form a linked list over the word's bytes; the
// lowest-ranked adjacent pair merges first, leftmost first among equal
// ranks, exactly as Hugging Face's Word::merge_all does without dropout.
// Short words scan the list for the best pair (fast, no heap); longer ones
// keep a binary heap of candidate pairs, so a word of n bytes costs
// O(n log n) however it merges.

// linearMergeMax is the longest word merged by linear scanning.
const linearMergeMax = 48

// scratch is per-call working memory, pooled by the Tokenizer.
type scratch struct {
	sym    []symbol
	heap   []cand
	pieces []string
	buf    []byte
}

type symbol struct {
	id         uint32
	prev, next int32 // -1 at the ends; a merged-away symbol has prev == -2
}

// cand is a candidate merge of the symbol at pos with its successor.
type cand struct {
	rank uint32
	pos  int32
	id   uint32
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

// mergeLinear repeatedly finds the best pair by scanning: O(n^2) but
// allocation-free and fastest for short words.
func (b *bpe) mergeLinear(sym []symbol) {
	for {
		best, bestPos := merge{rank: ^uint32(0)}, int32(-1)
		for i := int32(0); sym[i].next >= 0; i = sym[i].next {
			j := sym[i].next
			if m, ok := b.merges[pairKey(sym[i].id, sym[j].id)]; ok && m.rank < best.rank {
				best, bestPos = m, i
			}
		}
		if bestPos < 0 {
			return
		}
		b.apply(sym, bestPos, best.id)
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
	h := sc.heap[:0]
	push := func(c cand) {
		h = append(h, c)
		for k := len(h) - 1; k > 0; {
			p := (k - 1) / 2
			if !less(h[k], h[p]) {
				break
			}
			h[k], h[p] = h[p], h[k]
			k = p
		}
	}
	pop := func() cand {
		top := h[0]
		last := len(h) - 1
		h[0] = h[last]
		h = h[:last]
		for k := 0; ; {
			l, r, m := 2*k+1, 2*k+2, k
			if l < len(h) && less(h[l], h[m]) {
				m = l
			}
			if r < len(h) && less(h[r], h[m]) {
				m = r
			}
			if m == k {
				break
			}
			h[k], h[m] = h[m], h[k]
			k = m
		}
		return top
	}
	consider := func(i int32) {
		if i < 0 {
			return
		}
		j := sym[i].next
		if j < 0 {
			return
		}
		if m, ok := b.merges[pairKey(sym[i].id, sym[j].id)]; ok {
			push(cand{rank: m.rank, pos: i, id: m.id})
		}
	}
	for i := int32(0); i >= 0; i = sym[i].next {
		consider(i)
	}
	for len(h) > 0 {
		c := pop()
		i := c.pos
		if sym[i].prev == -2 || sym[i].next < 0 {
			continue
		}
		j := sym[i].next
		if m, ok := b.merges[pairKey(sym[i].id, sym[j].id)]; !ok || m.id != c.id {
			continue
		}
		b.apply(sym, i, c.id)
		consider(sym[i].prev)
		consider(i)
	}
	sc.heap = h
}

func less(a, b cand) bool {
	return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos)
}
