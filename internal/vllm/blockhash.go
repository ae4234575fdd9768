package vllm

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"io"

	"github.com/fxamacker/cbor/v2"
	"github.com/zeebo/xxh3"
)

// HashAlgo is one of vLLM's prefix-cache block-hash algorithms, named as
// --prefix-caching-hash-algo spells it (vllm/utils/hashing.py).
type HashAlgo string

// The four algorithms vLLM implements. The pickle-based ones serialise with
// Python pickle protocol 5, the _cbor ones with canonical CBOR (RFC 8949).
const (
	// HashSHA256 is vLLM's default: SHA-256 of the pickle, 32-byte digests.
	HashSHA256 HashAlgo = "sha256"
	// HashSHA256CBOR is SHA-256 of the canonical CBOR, 32-byte digests.
	HashSHA256CBOR HashAlgo = "sha256_cbor"
	// HashXXHash is XXH3-128 of the pickle, 16-byte digests (big-endian).
	HashXXHash HashAlgo = "xxhash"
	// HashXXHashCBOR is XXH3-128 of the canonical CBOR, 16-byte digests.
	HashXXHashCBOR HashAlgo = "xxhash_cbor"
)

// ParseHashAlgo validates a --prefix-caching-hash-algo value.
func ParseHashAlgo(s string) (HashAlgo, error) {
	switch a := HashAlgo(s); a {
	case HashSHA256, HashSHA256CBOR, HashXXHash, HashXXHashCBOR:
		return a, nil
	}
	return "", fmt.Errorf("unknown hash algorithm %q (want sha256, sha256_cbor, xxhash or xxhash_cbor)", s)
}

// cbor reports whether the algorithm serialises with CBOR (else pickle).
func (a HashAlgo) cbor() bool { return a == HashSHA256CBOR || a == HashXXHashCBOR }

// DigestSize is the length of the algorithm's digests in bytes: 32 for the
// SHA-256 algorithms, 16 for the XXH3-128 ones.
func (a HashAlgo) DigestSize() int {
	if a == HashXXHash || a == HashXXHashCBOR {
		return 16
	}
	return 32
}

// MMFeature is one multimodal item of a request, as vLLM's
// MultiModalFeatureSpec: its identifier (the mm hash, or
// "<lora_name>:<mm_hash>" with enable_tower_connector_lora; opaque here) and
// its placeholder position in tokens.
type MMFeature struct {
	Identifier string
	// Offset is the first placeholder token's index in the prompt.
	Offset int
	// Length is the number of placeholder tokens.
	Length int
}

// RequestKeys is what, besides the tokens, goes into a request's block
// hashes (vllm/v1/core/kv_cache_utils.py generate_block_hash_extra_keys).
type RequestKeys struct {
	// LoRAName is the adapter name, "" for the base model.
	LoRAName string
	// CacheSalt salts block 0 only; "" adds nothing.
	CacheSalt string
	// MM lists multimodal items sorted by Offset, not overlapping.
	MM []MMFeature
	// PromptEmbeds, when the request passed prompt embeddings instead of
	// text, holds the raw bytes of the embeddings tensor (row-major, one
	// row of PromptEmbedsRowBytes per token, as torch's tobytes). Each
	// block then gets SHA-256 of its rows as its last extra key. Not
	// covered by golden data.
	PromptEmbeds         []byte
	PromptEmbedsRowBytes int
}

// BlockExtraKeys returns the extra keys of the block [blockStart, blockEnd)
// in vLLM's order: the LoRA name, one (identifier, offset from blockStart)
// pair per multimodal item overlapping the block (as []any{string, int64};
// the offset is negative when the item began in an earlier block), the
// cache salt on the block starting at token 0 if non-empty, and the
// prompt-embeds digest ([]byte). It returns nil when there are none
// (Python None). It scans MM items from the first one, as vLLM's BlockPool
// does for the extra_keys of BlockStored events.
func BlockExtraKeys(req RequestKeys, blockStart, blockEnd int) []any {
	keys, _ := appendExtraKeys(nil, &req, req.LoRAName, req.CacheSalt, blockStart, blockEnd, 0)
	if len(keys) == 0 {
		return nil
	}
	return keys
}

// appendExtraKeys appends a block's extra keys to dst, starting the MM scan
// at mmIdx, and returns the next mmIdx (vLLM _gen_mm_extra_hash_keys).
// lora and salt are passed already boxed so that hashing many blocks does
// not box them again.
func appendExtraKeys(dst []any, req *RequestKeys, lora, salt any, start, end, mmIdx int) ([]any, int) {
	if req.LoRAName != "" {
		dst = append(dst, lora)
	}
	if mm := req.MM; len(mm) > 0 && mm[len(mm)-1].Offset+mm[len(mm)-1].Length > start {
		for mmIdx < len(mm) {
			f := &mm[mmIdx]
			if end <= f.Offset {
				break // the block has not reached this item
			}
			if start >= f.Offset+f.Length {
				mmIdx++ // the block is past this item
				continue
			}
			dst = append(dst, []any{f.Identifier, int64(f.Offset - start)})
			if end < f.Offset+f.Length {
				break // the item continues in the next block
			}
			mmIdx++
		}
	}
	if start == 0 && req.CacheSalt != "" {
		dst = append(dst, salt)
	}
	if req.PromptEmbeds != nil && req.PromptEmbedsRowBytes > 0 {
		lo, hi := start*req.PromptEmbedsRowBytes, end*req.PromptEmbedsRowBytes
		if lo <= len(req.PromptEmbeds) {
			d := sha256.Sum256(req.PromptEmbeds[lo:min(hi, len(req.PromptEmbeds))])
			dst = append(dst, d[:])
		}
	}
	return dst, mmIdx
}

// BlockHasher computes vLLM block hashes for one algorithm and NONE_HASH.
// It reuses internal buffers, so it is not safe for concurrent use; make one
// per goroutine.
type BlockHasher struct {
	algo HashAlgo
	none []byte
	pk   pickler
	cb   []byte
	em   cbor.EncMode
	keys []any
}

// NewBlockHasher returns a hasher for algo. seed is the engine's
// PYTHONHASHSEED string: when non-empty, NONE_HASH is the algorithm applied
// to that string (including a literal "random"); "" means the variable is
// unset, and NONE_HASH is then 32 bytes read from random (crypto/rand when
// nil), as vLLM's init_none_hash does with os.urandom(32). An engine with an
// unset seed has hashes no outsider can reproduce.
func NewBlockHasher(algo HashAlgo, seed string, random io.Reader) (*BlockHasher, error) {
	if _, err := ParseHashAlgo(string(algo)); err != nil {
		return nil, err
	}
	em, err := cbor.CanonicalEncOptions().EncMode()
	if err != nil {
		return nil, fmt.Errorf("cbor mode: %w", err)
	}
	h := &BlockHasher{algo: algo, em: em}
	if seed == "" {
		if random == nil {
			random = rand.Reader
		}
		h.none = make([]byte, 32)
		if _, err := io.ReadFull(random, h.none); err != nil {
			return nil, fmt.Errorf("read random NONE_HASH: %w", err)
		}
		return h, nil
	}
	h.none = h.digest(nil, h.serializeString(seed))
	return h, nil
}

// Algo returns the hasher's algorithm.
func (h *BlockHasher) Algo() HashAlgo { return h.algo }

// NoneHash returns NONE_HASH, the parent of a request's first block. The
// slice is shared; do not modify it.
func (h *BlockHasher) NoneHash() []byte { return h.none }

// HashBlock returns the digest of one full block: H((parent, tuple(tokens),
// extraKeys)). A nil or empty parent means NONE_HASH (vLLM hash_block_tokens
// treats any falsy parent so). extraKeys is nil for Python None, else a
// tuple whose items are string, int/int64/uint64, []byte, bool, float64,
// nil or nested []any. It panics only on an item of another type, which is
// a programming error; use it with keys from BlockExtraKeys or a decoded
// Event.
func (h *BlockHasher) HashBlock(parent []byte, tokens []uint32, extraKeys []any) []byte {
	d, err := h.AppendBlockHash(nil, parent, tokens, extraKeys)
	if err != nil {
		panic(fmt.Sprintf("vllm: HashBlock: %v", err))
	}
	return d
}

// AppendBlockHash is HashBlock appending the digest to dst; with capacity in
// dst it does not allocate. It fails on an extra-key item of an unsupported
// type.
func (h *BlockHasher) AppendBlockHash(dst, parent []byte, tokens []uint32, extraKeys []any) ([]byte, error) {
	if len(parent) == 0 {
		parent = h.none
	}
	s, err := h.serializeBlock(parent, tokens, extraKeys)
	if err != nil {
		return dst, err
	}
	return h.digest(dst, s), nil
}

// HashPrompt returns the digests of every full block of a prompt of tokens,
// chained from NONE_HASH, with each block's extra keys from req, exactly as
// vLLM's request block hasher (get_request_block_hasher) computes them when
// the request arrives. Trailing tokens of a partial block get no digest.
// The digests share one backing array.
func (h *BlockHasher) HashPrompt(tokens []uint32, blockSize int, req RequestKeys) [][]byte {
	if blockSize <= 0 {
		return nil
	}
	n := len(tokens) / blockSize
	size := h.algo.DigestSize()
	out := make([][]byte, n)
	backing := make([]byte, 0, n*size)
	var lora, salt any
	if req.LoRAName != "" {
		lora = req.LoRAName
	}
	if req.CacheSalt != "" {
		salt = req.CacheSalt
	}
	parent, mmIdx := h.none, 0
	for i := range n {
		start, end := i*blockSize, (i+1)*blockSize
		var keys []any
		keys, mmIdx = appendExtraKeys(h.keys[:0], &req, lora, salt, start, end, mmIdx)
		h.keys = keys
		if len(keys) == 0 {
			keys = nil
		}
		s, err := h.serializeBlock(parent, tokens[start:end], keys)
		if err != nil {
			panic(fmt.Sprintf("vllm: HashPrompt: %v", err)) // keys are built here: unreachable
		}
		backing = h.digest(backing, s)
		out[i] = backing[len(backing)-size : len(backing) : len(backing)]
		parent = out[i]
	}
	clear(h.keys) // drop references to the request's strings
	return out
}

// serializeString returns the serialisation of a Python str (NONE_HASH input).
func (h *BlockHasher) serializeString(s string) []byte {
	if h.algo.cbor() {
		h.cb = append(appendCBORHead(h.cb[:0], 3, uint64(len(s))), s...)
		return h.cb
	}
	h.pk.begin()
	h.pk.str(s)
	return h.pk.end()
}

// serializeBlock returns the serialisation of (parent, tuple(tokens),
// extraKeys), valid until the next call.
func (h *BlockHasher) serializeBlock(parent []byte, tokens []uint32, extraKeys []any) ([]byte, error) {
	if h.algo.cbor() {
		b := append(h.cb[:0], 0x83)
		b = append(appendCBORHead(b, 2, uint64(len(parent))), parent...)
		b = appendCBORHead(b, 4, uint64(len(tokens)))
		for _, t := range tokens {
			b = appendCBORHead(b, 0, uint64(t))
		}
		var err error
		if extraKeys == nil {
			b = append(b, 0xf6)
		} else {
			b, err = appendCBORArray(b, extraKeys, h.em, 0)
		}
		h.cb = b
		return b, err
	}
	p := &h.pk
	p.begin()
	p.tupleBegin(3)
	p.bytesObj(parent)
	p.tupleBegin(len(tokens))
	p.tokens(tokens)
	p.tupleEnd(len(tokens))
	if extraKeys == nil {
		p.none()
	} else if err := p.tuple(extraKeys, 0); err != nil {
		return nil, err
	}
	p.tupleEnd(3)
	return p.end(), nil
}

// digest appends H(b) to dst.
func (h *BlockHasher) digest(dst, b []byte) []byte {
	if h.algo.DigestSize() == 16 {
		d := xxh3.Hash128(b).Bytes()
		return append(dst, d[:]...)
	}
	d := sha256.Sum256(b)
	return append(dst, d[:]...)
}

// EventValue returns the value a KV event carries for a block digest: its
// last 8 bytes read big-endian (vLLM maybe_convert_block_hash,
// int.from_bytes(digest, "big") & (2**64-1)). Digests shorter than 8 bytes
// are read whole, as if left-padded with zeros.
func EventValue(digest []byte) BlockHash {
	if len(digest) >= 8 {
		return BlockHash(binary.BigEndian.Uint64(digest[len(digest)-8:]))
	}
	var b [8]byte
	copy(b[8-len(digest):], digest)
	return BlockHash(binary.BigEndian.Uint64(b[:]))
}
