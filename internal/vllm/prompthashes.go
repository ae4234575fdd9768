package vllm

import (
	"encoding/hex"
	"strconv"
)

// PromptHashes are a prompt's prefix-cache block hashes as "kvrouter
// blockhash" prints them: the hasher's NONE_HASH and one digest per full
// block (a trailing partial block has none), in hex, and each digest's
// value as a KV event carries it (EventValue), in decimal.
type PromptHashes struct {
	NoneHash    string   `json:"none_hash"`
	Digests     []string `json:"digests"`
	EventValues []string `json:"event_values"`
}

// HashPromptText hashes tokens with h in blocks of blockSize tokens under
// req's keys (HashPrompt) and returns the hashes as text.
func HashPromptText(h *BlockHasher, tokens []uint32, blockSize int, req RequestKeys) PromptHashes {
	digests := h.HashPrompt(tokens, blockSize, req)
	out := PromptHashes{
		NoneHash:    hex.EncodeToString(h.NoneHash()),
		Digests:     make([]string, len(digests)),
		EventValues: make([]string, len(digests)),
	}
	for i, d := range digests {
		out.Digests[i] = hex.EncodeToString(d)
		out.EventValues[i] = strconv.FormatUint(uint64(EventValue(d)), 10)
	}
	return out
}
