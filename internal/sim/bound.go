package sim

import (
	"github.com/zeebo/xxh3"

	"kvrouter/internal/workload"
)

// HitRateBound returns the hit rate no routing can beat on w with engines of
// blockSize-token blocks: every block of every earlier request is assumed
// cached on every replica forever, so request i hits the longest prefix it
// shares with any earlier request, counted as vLLM counts hits (whole
// blocks, at most prompt length - 1 tokens). Requests are taken in arrival
// order. It works on the workload's segments (a segment's tokens are a
// function of its key, and a shorter segment is a prefix of a longer one
// with the same key), so its cost is O(segments), not O(tokens).
func HitRateBound(w *workload.Workload, blockSize int) float64 {
	if blockSize < 1 {
		return 0
	}
	// seen maps a segment's node (its key and every segment before it, with
	// their lengths) to the longest length seen at that node.
	seen := make(map[uint64]int)
	var prompt, hit int64
	var buf [24]byte
	for i := range w.Requests {
		r := &w.Requests[i]
		n := r.InputTokens()
		prompt += int64(n)
		var node uint64
		matched, matching := 0, true
		prevLen := 0
		for _, s := range r.Prompt {
			node = chain(&buf, node, uint64(prevLen), s.Key)
			prevLen = s.Len
			if matching {
				l := seen[node]
				matched += min(l, s.Len)
				matching = l >= s.Len
			}
			if seen[node] < s.Len {
				seen[node] = s.Len
			}
		}
		usable := min(matched, n-1)
		hit += int64(usable / blockSize * blockSize)
	}
	if prompt == 0 {
		return 0
	}
	return float64(hit) / float64(prompt)
}

func chain(buf *[24]byte, parent, parentLen, key uint64) uint64 {
	put := func(o int, v uint64) {
		for j := range 8 {
			buf[o+j] = byte(v >> (8 * j))
		}
	}
	put(0, parent)
	put(8, parentLen)
	put(16, key)
	return xxh3.Hash(buf[:])
}
