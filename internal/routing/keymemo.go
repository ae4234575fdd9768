package routing

import (
	"encoding/binary"

	"github.com/zeebo/xxh3"

	"kvrouter/internal/kvindex"
)

// KeyMemo keeps the block keys of a prompt's leading tokens from one
// request for a later one that starts with the same tokens (met by
// tokenizer.PrefixMemo: the tokenizer's prefix cache knows which of a
// continuation's ids were its previous turn's). Keys are kept under a tag
// standing for everything besides the tokens they depend on.
type KeyMemo interface {
	// Keys returns the keys kept under tag for the prompt's first
	// len(keys) blocks (block i's at i), or nil; not to be modified.
	Keys(tag uint64) []uint64
	// Want returns how many leading blocks of blockSize tokens the memo
	// would keep keys of under tag (0: none, or kept already).
	Want(tag uint64, blockSize int) int
	// SetKeys keeps keys (the first blocks', at most Want's count) under
	// tag; keys belong to the memo from then on.
	SetKeys(tag uint64, keys []uint64)
}

// memoTag names the key space of a request's keys besides its tokens:
// the chain's root, the block size, the LoRA name and the cache_salt
// (kvindex.Keys's other inputs; multimodal items are never memoized).
func memoTag(ex kvindex.Extras, blockSize int) uint64 {
	b := make([]byte, 0, 32+len(ex.LoRA)+len(ex.CacheSalt))
	b = binary.LittleEndian.AppendUint64(b, uint64(ex.Root))
	b = binary.LittleEndian.AppendUint64(b, uint64(blockSize))
	b = binary.LittleEndian.AppendUint64(b, uint64(len(ex.LoRA)))
	b = append(b, ex.LoRA...)
	b = append(b, ex.CacheSalt...)
	return xxh3.Hash(b)
}

// promptKeys returns req's block keys in dst[:0] (kvindex.Keys of
// req.Tokens and req.Extras): with a req.KeyMemo, the keys it kept for
// the leading blocks, then the rest hashed on from the last of them, and
// the memo is offered the keys for later requests. Continuing the chain
// from a kept key is exact: a block's key depends on its parent key, its
// tokens, the LoRA name, and the cache_salt on block 0 only.
func promptKeys(dst []kvindex.Key, req *Request, blockSize int) []kvindex.Key {
	m := req.KeyMemo
	if m == nil || len(req.Extras.MM) > 0 || blockSize <= 0 {
		return kvindex.Keys(dst, req.Tokens, blockSize, req.Extras)
	}
	tag := memoTag(req.Extras, blockSize)
	kept := m.Keys(tag)
	if len(kept) == 0 || len(kept) > len(req.Tokens)/blockSize {
		dst = kvindex.Keys(dst, req.Tokens, blockSize, req.Extras)
	} else {
		dst = dst[:0]
		for _, k := range kept {
			dst = append(dst, kvindex.Key(k))
		}
		rest := kvindex.Keys(dst[len(dst):], req.Tokens[len(kept)*blockSize:], blockSize,
			kvindex.Extras{Root: dst[len(dst)-1], LoRA: req.Extras.LoRA})
		dst = append(dst, rest...) // in place unless rest outgrew dst
	}
	if n := min(m.Want(tag, blockSize), len(dst)); n > 0 {
		keys := make([]uint64, n)
		for i := range keys {
			keys[i] = uint64(dst[i])
		}
		m.SetKeys(tag, keys)
	}
	return dst
}
