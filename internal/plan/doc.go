// Package plan sizes a vLLM deployment's KV cache: the bytes one token's
// keys and values take (from a model's Hugging Face config.json or named
// figures), how many tokens and blocks fit on a GPU, a tensor-parallel
// replica and a node, how many requests of a given context fit at once
// (with an FP8 KV cache, a thinking budget and image tokens), and how long
// one request's KV takes to move between machines for disaggregated
// prefill/decode serving.
//
// Units: bytes are bytes; sizes print as GiB (2^30) and GB (10^9), both
// named; link speeds are decimal GB/s; context and budgets are tokens; a
// block is BlockSize tokens. The arithmetic follows vLLM's (main
// 2026-08-07): full attention stores a key and a value vector per layer
// per KV head (vllm/v1/kv_cache_interface.py FullAttentionSpec,
// page_size_bytes = 2 * block_size * num_kv_heads * head_size * dtype
// bytes); MLA stores one latent of kv_lora_rank + qk_rope_head_dim per
// layer (MLAAttentionSpec, no factor 2) replicated on every tensor-parallel
// rank; KV heads split across ranks, replicated when fewer than the ranks
// (vllm/config/model.py get_num_kv_heads); the memory for KV is
// gpu_memory_utilization * GPU memory minus the weights and what the
// profile run reserves (vllm/v1/worker/gpu_worker.py determine_available_memory).
//
// Everything is pure computation, safe for concurrent use, with no
// goroutines. KVBytesPerToken and TransferSeconds are the shared cost
// functions: the simulator's engine profiles and a prefill/decode cost
// model are meant to call them rather than restate the formula.
package plan
