package kvindex

import (
	"unsafe"

	"github.com/zeebo/xxh3"
)

// Key is the router's chained 64-bit block key: it identifies one full block
// of tokens together with every block before it, within one key space
// (model and pool). See the package doc.
type Key uint64

// MMItem is one multimodal item of a prompt, as vLLM's mm_features describe
// it: the item's content identifier and its placeholder's position in the
// prompt, in tokens.
type MMItem struct {
	// Identifier is the item's content hash (vLLM's mm_hash, e.g. a 64-digit
	// hex string, prefixed "lora:" when a LoRA adapter is active).
	Identifier string
	// Offset is the index of the item's first placeholder token in the prompt.
	Offset int
	// Length is the number of placeholder tokens.
	Length int
}

// Extras are the per-request inputs of a block's key besides its tokens.
// They reproduce vLLM's per-block extra_keys tuple (vllm/v1/core/
// kv_cache_utils.py generate_block_hash_extra_keys): the LoRA name on every
// block, then (Identifier, Offset-blockStart) for each MMItem overlapping the
// block, then CacheSalt on block 0 only. Prompt-embedding hashes are not
// supported.
type Extras struct {
	// Root starts the chain: Root(model, pool). The zero Key is a valid root
	// of its own (tests), but every index derives its root from Config.
	Root Key
	// LoRA is the adapter name ("" for the base model).
	LoRA string
	// CacheSalt is the request's cache_salt ("" when absent).
	CacheSalt string
	// MM lists multimodal items sorted by Offset.
	MM []MMItem
}

// Root returns the first parent of every chain in the key space of model
// served by pool (e.g. "", "prefill", "decode").
func Root(model, pool string) Key {
	var b [256]byte
	p := append(b[:0], "kvrouter/v1\x00"...)
	p = append(p, model...)
	p = append(p, 0)
	p = append(p, pool...)
	return Key(xxh3.Hash(p))
}

// Keys appends to dst[:0] the keys of the full blocks of tokens, in order,
// and returns the slice: len(tokens)/blockSize keys. It allocates only when
// dst is too short. blockSize <= 0 yields no keys.
func Keys(dst []Key, tokens []uint32, blockSize int, ex Extras) []Key {
	dst = dst[:0]
	if blockSize <= 0 {
		return dst
	}
	n := len(tokens) / blockSize
	if cap(dst) < n {
		dst = make([]Key, 0, n)
	}
	plain := ex.LoRA == "" && ex.CacheSalt == "" && len(ex.MM) == 0
	parent := ex.Root
	mm := 0 // first MM item that may overlap the current block
	for i := range n {
		blk := tokens[i*blockSize : (i+1)*blockSize]
		seed := uint64(parent)
		if !plain {
			start, end := i*blockSize, (i+1)*blockSize
			for mm < len(ex.MM) && ex.MM[mm].Offset+ex.MM[mm].Length <= start {
				mm++
			}
			e := newExtraEnc()
			if ex.LoRA != "" {
				e.str(ex.LoRA)
			}
			for j := mm; j < len(ex.MM) && ex.MM[j].Offset < end; j++ {
				it := ex.MM[j]
				if it.Offset+it.Length <= start {
					continue
				}
				e.tuple(2)
				e.str(it.Identifier)
				e.int(int64(it.Offset - start))
			}
			if i == 0 && ex.CacheSalt != "" {
				e.str(ex.CacheSalt)
			}
			seed = e.seed(seed)
		}
		parent = Key(hashTokens(blk, seed))
		dst = append(dst, parent)
	}
	return dst
}

// tokenBytes views token ids as bytes (native byte order; keys are
// process-local, see the package doc).
func tokenBytes(t []uint32) []byte {
	if len(t) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&t[0])), len(t)*4)
}

// extraEnc folds one block's extra keys into a running 64-bit hash, item by
// item with a type tag, so that the tuple built from a request's Extras and
// the tuple read from a BlockStored event's extra_keys hash the same without
// a buffer.
type extraEnc struct {
	h uint64
	n int
}

func newExtraEnc() extraEnc { return extraEnc{h: 0x6b76726f75746572} }

func (e *extraEnc) str(s string) {
	e.n++
	e.h = xxh3.HashStringSeed(s, e.h^uint64(len(s))<<8^'s')
}

func (e *extraEnc) int(v int64) {
	e.n++
	e.h = mix(e.h ^ mix(uint64(v)^'i'<<56))
}

// tuple opens a nested tuple of n items (which the caller then writes).
func (e *extraEnc) tuple(n int) {
	e.n++
	e.h = mix(e.h ^ mix(uint64(n)^'t'<<56))
}

// any serialises a decoded msgpack value of an extra_keys tuple. It reports
// false for a value that vLLM never writes there (floats, maps, ...).
func (e *extraEnc) any(v any) bool {
	switch x := v.(type) {
	case string:
		e.str(x)
	case []byte:
		e.str(string(x))
	case int64:
		e.int(x)
	case uint64:
		e.int(int64(x))
	case int:
		e.int(int64(x))
	case []any:
		e.tuple(len(x))
		for _, y := range x {
			if !e.any(y) {
				return false
			}
		}
	default:
		return false
	}
	return true
}

// seed mixes the block's extras into the parent key; a block without extras
// keeps the parent as seed.
func (e *extraEnc) seed(parent uint64) uint64 {
	if e.n == 0 {
		return parent
	}
	return mix(parent^e.h) ^ e.h
}

// eventSeed computes a stored block's hash seed from its parent key and the
// event's extra keys for the block (nil = none). lora is the event's
// lora_name, used when the engine sent no extra_keys at all (older engines).
// ok is false when the tuple holds a value vLLM never writes.
func eventSeed(parent Key, extra []any, lora string, haveExtra bool) (seed uint64, ok bool) {
	if !haveExtra && lora == "" {
		return uint64(parent), true // no extras: the parent is the seed
	}
	e := newExtraEnc()
	if !haveExtra {
		e.str(lora)
		return e.seed(uint64(parent)), true
	}
	for _, v := range extra {
		if !e.any(v) {
			return 0, false
		}
	}
	return e.seed(uint64(parent)), true
}

// hashTokens is one block's key given its seed (parent key mixed with extras).
func hashTokens(t []uint32, seed uint64) uint64 { return xxh3.HashSeed(tokenBytes(t), seed) }

// mix is a full 64-bit finaliser (MurmurHash3's fmix64), folding extra
// keys into a block's seed.
func mix(h uint64) uint64 {
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}
