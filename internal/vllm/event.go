package vllm

import "fmt"

// BlockHash is an engine's block hash as it appears in KV events: the last 8
// bytes of the digest read big-endian (vLLM's default,
// VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1). Decoders also accept negative int64
// from other encoders (reinterpreted as uint64) and raw digest bytes (reduced
// to their last 8 bytes). Source: vllm/distributed/kv_events.py,
// vllm/v1/core/kv_cache_utils.py maybe_convert_block_hash.
type BlockHash uint64

// Medium is the storage tier a block lives on.
type Medium uint8

// The tiers vLLM reports in an event's "medium" field. A nil medium (engines
// before v0.10.2) means GPU.
const (
	MediumGPU Medium = iota
	MediumCPU
	MediumStorage
)

// String returns the name vLLM writes on the wire: "GPU", "CPU" or "STORAGE".
func (m Medium) String() string {
	switch m {
	case MediumGPU:
		return "GPU"
	case MediumCPU:
		return "CPU"
	case MediumStorage:
		return "STORAGE"
	}
	return fmt.Sprintf("Medium(%d)", uint8(m))
}

// ParseMedium maps a wire name to a Medium. The empty string (a nil medium)
// is GPU. Names are matched exactly as vLLM writes them; anything else
// returns ok == false.
func ParseMedium(s string) (m Medium, ok bool) {
	switch s {
	case "", "GPU":
		return MediumGPU, true
	case "CPU":
		return MediumCPU, true
	case "STORAGE":
		return MediumStorage, true
	}
	return MediumGPU, false
}

// EventType tells which of vLLM's three KV events an Event is.
type EventType uint8

// The KV event tags, as written in the "type" key (map layout, vLLM >= 0.24)
// or as the first array element (older layouts).
const (
	BlockStored EventType = iota + 1
	BlockRemoved
	AllBlocksCleared
)

// String returns the wire tag: "BlockStored", "BlockRemoved" or "AllBlocksCleared".
func (t EventType) String() string {
	switch t {
	case BlockStored:
		return "BlockStored"
	case BlockRemoved:
		return "BlockRemoved"
	case AllBlocksCleared:
		return "AllBlocksCleared"
	}
	return fmt.Sprintf("EventType(%d)", uint8(t))
}

// FullAttention is the kv_cache_spec_kind of the attention group a prefix
// router indexes. Events with another kind (sliding_window, mamba) describe
// hybrid models' other groups and must not be indexed as prefixes.
const FullAttention = "full_attention"

// Event is one decoded KV event, normalised to the fields of the current
// schema (vLLM main 2026-08-07). Fields absent from the payload (omitted
// defaults, or missing trailing fields of an old array layout) are nil or
// zero. Which fields are meaningful depends on Type:
//   - BlockStored: BlockHashes, ParentBlockHash, TokenIDs, BlockSize, LoRAID,
//     Medium, LoRAName, ExtraKeys, GroupIdx, KVCacheSpecKind,
//     KVCacheSpecSlidingWindow, Locality.
//   - BlockRemoved: BlockHashes, Medium, GroupIdx, Locality.
//   - AllBlocksCleared: none.
type Event struct {
	Type EventType
	// BlockHashes are the engine's hashes, one per block, in prefix order.
	BlockHashes []BlockHash
	// ParentBlockHash is the hash of the block before the first one, or nil
	// when the first block starts at token 0. Hit reports
	// (kv_cache_report_mode "full") also carry nil. DecodeBatch reads a
	// parent of value 0 as nil, in both layouts: vLLM writes nil, but
	// hash_block_tokens (vllm/v1/core/kv_cache_utils.py) takes any falsy
	// parent (None, 0, b"") for NONE_HASH, and llm-d-inference-sim writes 0
	// in the positional layout (as llm-d's own consumer reads it: 0 is no
	// parent). A real parent hash is 0 with probability 2^-64.
	ParentBlockHash *BlockHash
	// TokenIDs are all tokens of the stored blocks, len = len(BlockHashes) *
	// BlockSize on full-attention groups; may be empty for tokenless offload
	// placeholders.
	TokenIDs []uint32
	// BlockSize is in tokens; 0 when absent.
	BlockSize int
	// LoRAID is the deprecated integer adapter id (nil when absent).
	LoRAID *int64
	// Medium is the raw wire value: "GPU", "CPU", "STORAGE", or "" when nil.
	// Use Tier for the parsed value.
	Medium string
	// LoRAName is the adapter name, nil for base-model blocks.
	LoRAName *string
	// ExtraKeys holds one entry per block: nil, or a slice standing for a
	// Python tuple whose items are string, int64, uint64 or nested []any
	// (a multimodal (identifier, offset) pair). Nil when the field is absent.
	ExtraKeys [][]any
	// GroupIdx is the KV cache group (hybrid models); nil when absent (= 0).
	GroupIdx *int
	// KVCacheSpecKind is e.g. "full_attention" or "sliding_window"; "" when absent.
	KVCacheSpecKind string
	// KVCacheSpecSlidingWindow is the window in tokens for sliding-window groups.
	KVCacheSpecSlidingWindow *int
	// Locality is e.g. "LOCAL"; "" when absent.
	Locality string
}

// Tier returns the parsed medium; an unknown name counts as GPU.
func (e *Event) Tier() Medium {
	m, _ := ParseMedium(e.Medium)
	return m
}

// Group returns GroupIdx, or 0 when absent.
func (e *Event) Group() int {
	if e.GroupIdx == nil {
		return 0
	}
	return *e.GroupIdx
}

// IsFullAttention reports whether the event describes a full-attention group:
// KVCacheSpecKind is "full_attention" or absent (engines before v0.22 had no
// hybrid groups).
func (e *Event) IsFullAttention() bool {
	return e.KVCacheSpecKind == "" || e.KVCacheSpecKind == FullAttention
}

// Batch is one KVEventBatch: the payload of one PUB message, published once
// per engine step that produced events. On the wire it is always the msgpack
// array [ts float64, events, data_parallel_rank int].
type Batch struct {
	// TS is the engine's wall clock when the batch was made, in seconds
	// since the Unix epoch.
	TS     float64
	Events []Event
	// DataParallelRank is the publishing rank (0 without data parallelism).
	DataParallelRank int
}
