// Package kvindex answers, for a request's prompt, how many of its leading
// KV-cache blocks each replica of a model already holds, per storage tier.
//
// # Keys
//
// A prompt of n tokens is cut into n/BlockSize full blocks (a partial last
// block is never cached by vLLM, so it has no key). Block i gets the router's
// own 64-bit Key: XXH3 over the previous block's Key, the block's token ids and
// the block's extra keys (LoRA adapter name on every block, one (identifier,
// offset-from-block-start) pair per multimodal item overlapping the block,
// cache_salt on block 0: the same tuple vLLM hashes, see Extras). The chain
// starts at Root(model, pool), so a Key identifies a block together with
// everything before it, and two models or two pools (prefill and decode) never
// share keys. Keys are process-local: they are not vLLM's block hashes (those
// depend on a per-engine seed) and are never sent anywhere.
//
// # Indexes
//
// Replicas are named by the caller (engine name or URL) and numbered densely by
// the index (ReplicaID, from 0; an ID is reused after RemoveReplica). Lookup
// fills one Match per ReplicaID, so callers size the output with NumReplicas.
//
// Exact is fed by vLLM KV events (Apply, one vllm.Batch at a time per engine
// and data-parallel rank). BlockStored re-hashes the event's token_ids into
// Keys, chained from the parent's Key: the engine's parent hash is resolved
// through a per-(engine, rank, KV group) table of the engine hashes it stored
// earlier; a nil parent chains from the root; an unknown parent is counted
// (Stats.UnknownParent) and the event skipped, with one warning per engine
// when such events keep coming (unknown.go). Each stored engine block is one
// entry (Key, engine, rank, group) with a copy count per medium (GPU, CPU,
// STORAGE). A BlockStored whose parent is nil and whose first block is already
// held (a kv_cache_report_mode "full" hit report) refreshes recency and adds
// no copies. BlockRemoved drops one copy through the engine-hash table;
// AllBlocksCleared and Reset drop only that engine and rank's entries. Only
// full-attention groups are indexed (vllm.Event.IsFullAttention). The number
// of entries is capped (Config.MaxEntries), evicting by CLOCK, an
// approximation of least recently used: storing or reporting an entry marks
// it hot; the eviction hand sweeps the entries in slab order, cooling the hot
// ones it passes and evicting the first cold one, so an entry stored or
// reported since the hand last passed it outlives one that was not. (A
// doubly linked LRU list cost a removal two more cache misses, the list
// neighbours, in a large index.)
//
// Exact also keeps predicted blocks: Routed(replica, keys) records the keys of
// a request just sent to replica; a prompt sharing a prefix with them counts
// that prefix for replica (Match.Predicted, where it holds no copy) until the
// replica's BlockStored events have confirmed every block it did not hold, in
// order, or Config.PredictTTL passes. A routed request costs one copy of its
// keys, not an entry per block (predict.go). Stats.Confirmed/Stats.Predicted
// is the confirmation rate: a low rate means the router's tokens differ from
// the engine's.
//
// Approx is for engines without events: Routed inserts the request's keys for
// the chosen replica, or refreshes those it holds, keeping at most the
// replica's capacity in blocks (SetCapacity, e.g. vLLM's num_gpu_blocks) and
// evicting the least recently routed, so the model evicts as the engine does
// instead of growing or forgetting with time (Config.ApproxTTL is an
// optional upper bound, off by default). Its blocks are reported as GPU.
//
// # Snapshots
//
// A consumer of KV event streams applies each batch with ApplyMarked, which
// records per (engine, rank) the batch's Mark (seq and payload hash) in the
// same step as its events. Snapshot copies the marked ranks' entries and
// marks; EncodeSnapshots and DecodeSnapshots write and read them as a
// versioned, checksummed file (snapshot_file.go); Restore loads one into an
// index after checking all of it, so a restarted router resumes each stream
// after its mark (kvevents.SubscriberConfig.Resume).
//
// # Lookup
//
// Lookup(keys, out) walks the keys in order and, per replica, counts the
// leading run of blocks the replica holds on some tier or has predicted: a
// block counts once, on its best tier (GPU, then predicted, then CPU, then
// STORAGE). The run of a replica ends at its first missing block.
//
// Exact keeps, for every key held by several entries (4 or more for up to
// 128 replicas, more for larger fleets), a holder record: two bits per replica
// giving its best tier over all its entries of that key (all ranks and
// groups). Lookup walks the keys keeping the set of replicas whose run is
// still going and each one's tier at the previous block, one 64-bit word per
// 64 replicas, and credits a replica's Match only when its tier changes or
// its run ends; it stops when no run is left. The cost is one or two hash
// probes per block plus O(len(keys)*NumReplicas/64 + tier changes), whatever
// the fleet's shape (a 15,000-block prompt against 96 replicas holding
// 727,500 (block, replica) pairs on it: well under a millisecond). Keys with
// fewer holders, predicted blocks, Approx and fleets beyond 1,024 replicas
// visit each holder entry instead. Lookup does not allocate when out has
// capacity for NumReplicas.
//
// # Concurrency and time
//
// Exact and Approx are safe for concurrent use by any number of goroutines:
// one sync.RWMutex per index guards the entries (Apply, Reset and
// Approx.Routed write; Lookup reads) and a second one guards predictions
// (Exact.Routed writes, under the entry lock's read side; Apply settles the
// predictions its batch confirms before releasing the entry lock). Several
// subscribers, one per engine, may call Apply at once; their batches are
// applied one at a time, each atomically. Lookups run in parallel with each
// other and with Routed, and wait only for the batch being applied.
// Neither type starts goroutines; expiry is lazy (checked on lookup, swept on
// insert). Time comes from Config.Now (time.Now when nil), so a simulator can
// run the index on a virtual clock.
//
// Memory: an entry costs 32 bytes (half a cache line, so loading one is one
// miss; Approx adds 8 bytes of LRU links kept beside the entries) plus its
// share of two open-addressing tables (groups of 12 slots in a 64-byte cache line: a 4-byte entry index
// and a tag byte, a 7-bit fingerprint of the hashed value, a slot; at most 10 values a group on average
// before the table doubles) and, for keys with a
// holder record, of the record (16 + 16*ceil(replicas/64) bytes); measured
// bytes per entry are in docs/routing.md. Stats.Bytes reports the index's own
// allocation. Config.ExpectedEntries allocates the key table for a known
// fleet capacity at creation instead of doubling it as the index fills.
package kvindex
