// Package enginesim is a simulated vLLM engine, faithful where a KV-aware
// router looks: the OpenAI API, the prefix cache and its KV events, and step
// timing. It has two layers.
//
// Core is the engine core: a deterministic, single-owner state machine with
// no goroutines and no clock, modelled on vLLM V1 (vllm/v1/core/
// kv_cache_manager.py, block_pool.py, sched/scheduler.py):
//
//   - Prefix cache of CoreConfig.NumGPUBlocks paged blocks of BlockSize
//     tokens (one is vLLM's null block). At admission a request reuses the
//     longest chain of cached block hashes covering at most n-1 of its n
//     tokens, in whole blocks. Blocks are hashed and cached when scheduled,
//     prompt and decode blocks alike, with vLLM's chained hash and extra keys
//     (LoRA name on every block, (identifier, offset) of each multimodal item
//     overlapping a block, cache_salt on block 0; images: media.go). Freed
//     blocks keep their hash in an LRU free queue (a request's tail blocks
//     first) and are evicted only when reallocated, unreferenced.
//   - Optional CPU tier (NumCPUBlocks): evicted blocks are offloaded; a prefix
//     that continues there is reloaded at CPULoadTokensPerSec instead of
//     recomputed.
//   - Scheduler: running sequences first, then waiting ones (FCFS) within
//     MaxNumSeqs and MaxNumBatchedTokens per step (chunked prefill);
//     preemption by recompute of the last running sequence when blocks run
//     out.
//   - Timing: a step lasts StepOverhead + uncached prefill tokens /
//     PrefillTokensPerSec + decoding sequences x DecodePerSeq + reloaded
//     tokens / CPULoadTokensPerSec (Timing; named profiles via Profile).
//
// Its API is: NewCore(cfg); Submit(*Request) queues a request; Step() runs
// one step and returns its Duration, per-request Outputs (one token per
// scheduled sequence whose tokens are all computed; the first has Index 0;
// CachedTokens for usage) and the KV Events (vllm.Event: BlockStored,
// BlockRemoved, AllBlocksCleared, in vLLM's semantics, including hit reports
// for Request.ReportHits); Abort(id); ResetPrefixCache(); Idle, Waiting,
// Running, KVUsage, Stats. A caller on a virtual clock (the fleet simulator)
// calls Step, advances its clock by Duration and delivers the outputs then.
// Hashing is pluggable (BlockHasher): the server uses vLLM's algorithms from
// internal/vllm (sha256 by default, seeded by PYTHONHASHSEED); FastHasher
// (XXH3-64, not vLLM-compatible) and NoEvents make simulations cheap.
//
// Server wraps a Core for the wall clock: one engine goroutine steps the core
// in real time (sleeping each step's duration through a Clock), the HTTP
// handlers (/v1/completions, /v1/chat/completions with SSE streaming,
// /v1/models, /health, /tokenize, /metrics with vLLM's metric names,
// /reset_prefix_cache, /admin/restart, /admin/stall-events, /admin/freeze)
// talk to it over a channel, and a ZeroMQ publisher
// (github.com/go-zeromq/zmq4) sends every step's events as vLLM's [topic,
// seq, payload] frames with a replay ROUTER.
// Faults inject errors, latency spikes, broken streams, hangs, slow starts,
// dropped event batches, publisher stalls, a hung engine core (/admin/freeze:
// no step runs while HTTP keeps answering) and engine restarts. A restart
// (/admin/restart, SIGHUP) looks like a new vLLM process on the wire: the
// cache and sequence numbers reset, and the PUB and replay sockets are
// closed (dropping every connection), emptied and reopened on the same
// endpoints.
//
// Disaggregated prefill and decode: Request.RemoteKV and RemoteDecode give
// the core vLLM's NixlConnector behaviour (pdcore.go: a decode-side request
// waits for its KV pull outside every batch, then runs); Config.PD gives
// the server the roles and kv_transfer_params (pdserver.go).
//
// Concurrency: Core is not safe for concurrent use. Server is; New starts
// nothing, Run/Serve start the HTTP server, the engine loop and the publisher
// and return after all of them stopped.
//
// docs/engine-sim.md documents the flags, the timing profiles and where
// their numbers come from, and the benchmarks.
package enginesim
