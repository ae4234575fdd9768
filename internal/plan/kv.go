package plan

import "math"

// KVBytesPerToken returns the KV cache bytes one token takes on a whole
// replica (all tensor-parallel ranks together) with elements of elemBytes
// bytes: 2 * layers * kv_heads * head_dim * elemBytes for full attention
// (a key and a value vector per layer per KV head), layers *
// (kv_lora_rank + qk_rope_head_dim) * elemBytes for MLA. Llama 3 8B in
// bfloat16: 2*32*8*128*2 = 131,072. Shared by `kvrouter plan`, the
// simulator's engine profiles and a prefill/decode transfer cost.
func KVBytesPerToken(m Model, elemBytes float64) float64 {
	if m.MLA() {
		return float64(m.Layers) * (float64(m.KVLoraRank) + float64(m.QKRopeHeadDim)) * elemBytes
	}
	return 2 * float64(m.Layers) * float64(m.KVHeads) * float64(m.HeadDim) * elemBytes
}

// KVBytesPerTokenPerGPU returns what one token takes on each GPU of a
// tensor-parallel group of tp ranks: KV heads split across the ranks, each
// rank holding at least one (vLLM replicates KV heads when they are fewer
// than the ranks); an MLA latent is replicated on every rank. tp < 1
// counts as 1.
func KVBytesPerTokenPerGPU(m Model, elemBytes float64, tp int) float64 {
	if tp < 1 {
		tp = 1
	}
	if m.MLA() {
		return KVBytesPerToken(m, elemBytes)
	}
	heads := m.KVHeads / tp
	if heads < 1 {
		heads = 1
	}
	return 2 * float64(m.Layers) * float64(heads) * float64(m.HeadDim) * elemBytes
}

// Link is a path KV moves over between a prefill and a decode engine.
type Link struct {
	// Name is how the link is printed.
	Name string `json:"name"`
	// BytesPerSec is its sustained one-direction throughput (decimal).
	BytesPerSec float64 `json:"bytes_per_sec"`
}

// Links returns the nominal links of the transfer table, one direction,
// decimal: NVLink 4 (H100, 900 GB/s both directions) 450 GB/s,
// InfiniBand NDR 400 Gb/s 50 GB/s, RoCE 200 Gb/s 25 GB/s, TCP over a
// 10 GbE-class path about 1 GB/s. Real transfers reach less (protocol,
// copies, contention): read them as lower bounds.
func Links() []Link {
	return []Link{
		{"NVLink", 450e9},
		{"InfiniBand", 50e9},
		{"RoCE", 25e9},
		{"TCP", 1e9},
	}
}

// TransferSeconds returns the seconds moving bytes at bytesPerSec takes,
// ignoring latency and set-up (+Inf for a non-positive rate).
func TransferSeconds(bytes, bytesPerSec float64) float64 {
	if bytesPerSec <= 0 {
		return math.Inf(1)
	}
	return bytes / bytesPerSec
}
