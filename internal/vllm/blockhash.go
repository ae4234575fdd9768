package vllm

import "encoding/binary"

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
