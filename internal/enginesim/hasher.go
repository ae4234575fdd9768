package enginesim

import (
	"encoding/binary"
	"unsafe"

	"github.com/zeebo/xxh3"
)

// BlockHasher computes one block's digest in a chain, as vLLM's
// hash_block_tokens: parent is the previous block's digest, or nil for the
// first block (the hasher then uses its NONE_HASH); tokens are the block's
// token ids; extraKeys is nil or the block's extra keys (LoRA name,
// multimodal items, cache_salt). The returned digest may be overwritten by
// the next call; the caller copies what it keeps. The KV event value is its last 8 bytes read
// big-endian (vllm.EventValue). A Core calls its hasher from one goroutine.
type BlockHasher interface {
	HashBlock(parent []byte, tokens []uint32, extraKeys []any) []byte
}

// FastHasher is the simulator's cheap chained hash: XXH3-64 over the parent
// digest, the tokens as little-endian uint32 and the extra keys, with
// NONE_HASH = XXH3-64 of the seed string. Its 8-byte digests are NOT vLLM's
// hashes: use it only where nobody re-derives hashes from tokens (the fleet
// simulator, which indexes by token content). It costs ~20 ns per 16-token
// block against ~1 µs for vLLM's sha256 (see docs/engine-sim.md). It is not
// safe for concurrent use.
type FastHasher struct {
	none [8]byte
	out  [8]byte
	buf  []byte
}

// NewFastHasher returns a FastHasher seeded like PYTHONHASHSEED seeds vLLM.
func NewFastHasher(seed string) *FastHasher {
	h := &FastHasher{}
	binary.BigEndian.PutUint64(h.none[:], xxh3.HashString(seed))
	return h
}

// HashBlock implements BlockHasher.
func (h *FastHasher) HashBlock(parent []byte, tokens []uint32, extraKeys []any) []byte {
	if parent == nil {
		parent = h.none[:]
	}
	b := append(h.buf[:0], parent...)
	if littleEndian() {
		// The tokens' memory already is their little-endian encoding.
		b = append(b, unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(tokens))), 4*len(tokens))...)
	} else {
		for _, t := range tokens {
			b = binary.LittleEndian.AppendUint32(b, t)
		}
	}
	b = appendFastKeys(b, extraKeys)
	h.buf = b
	binary.BigEndian.PutUint64(h.out[:], xxh3.Hash(b))
	return h.out[:]
}

// appendFastKeys appends extra keys to a FastHasher input: each key after
// a 0xff separator, strings as bytes, ints as 8 bytes, a tuple (a
// multimodal item's (identifier, offset)) as 0xfe, its items, 0xfd.
func appendFastKeys(b []byte, keys []any) []byte {
	for _, k := range keys {
		b = append(b, 0xff) // separator: keys cannot be confused with tokens
		switch v := k.(type) {
		case string:
			b = append(b, v...)
		case int:
			b = binary.LittleEndian.AppendUint64(b, uint64(v))
		case int64:
			b = binary.LittleEndian.AppendUint64(b, uint64(v))
		case []any:
			b = append(appendFastKeys(append(b, 0xfe), v), 0xfd)
		}
	}
	return b
}

// littleEndian reports whether the machine stores integers little-endian
// (a constant the compiler folds).
func littleEndian() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}

// blockExtraKeys returns a block's extra keys in vLLM's order
// (generate_block_hash_extra_keys, vllm/v1/core/kv_cache_utils.py): the LoRA
// name on every block, then cache_salt on the block that starts at token 0
// when non-empty; nil when there are none. Requests with multimodal items
// take mmExtraKeys instead; the simulator has no prompt embeddings.
func blockExtraKeys(loraName, cacheSalt string, block int) []any {
	salt := block == 0 && cacheSalt != ""
	switch {
	case loraName != "" && salt:
		return []any{loraName, cacheSalt}
	case loraName != "":
		return []any{loraName}
	case salt:
		return []any{cacheSalt}
	}
	return nil
}
