// Package vllm holds kvrouter's side of the vLLM engine contract: decoding and
// encoding the KV events an engine publishes over ZeroMQ, a subscriber that
// tracks sequence numbers and replays gaps, vLLM's four prefix-cache
// block-hash algorithms, and the Prometheus metrics an engine exposes.
//
// Facts are from vLLM main at 5ac2684976ee (2026-08-07),
// vllm/distributed/kv_events.py and vllm/v1/core/kv_cache_utils.py, and from
// release tags v0.9.0 to v0.25.1 for older layouts.
//
// Frames: a PUB message is [topic, seq, payload]; seq is 8 bytes big-endian,
// starting at 0 per engine process and rank, +1 per batch; a restart resets it
// to 0 with no clear event. Replay (DEALER to the engine's ROUTER): send
// ["", seq8]; receive ["", topic, seq8, payload] per buffered batch with seq >=
// requested (older engines: ["", seq8, payload]), then the end marker with seq
// ff..ff and an empty payload.
//
// Payload: msgpack [ts float64, events, data_parallel_rank]. Events are maps
// with "type" first (vLLM >= 0.24) or positional arrays [tag, fields...]
// (older; trailing fields vary by version). See Event for the fields.
//
// What is here:
//   - DecodeBatch and AppendBatch: payload bytes to Batch and back (map or
//     array Layout). Decode errors are *DecodeError, unwrapping to ErrMalformed.
//   - BlockHasher: vLLM's sha256, sha256_cbor, xxhash and xxhash_cbor block
//     hashes, NONE_HASH from PYTHONHASHSEED, BlockExtraKeys, EventValue.
//   - Update, Position and ResetReason: what the kvevents subscriber hands
//     its consumer (a batch in sequence order, where to resume, when to
//     forget a rank), and the bounds of its queue (DefaultQueueSize,
//     MaxQueueSize, in Updates) and messages (DefaultMaxMessageBytes, in
//     bytes), so that consumers and router.yaml's schema need no ZeroMQ.
//
// It starts no goroutines and imports no networking, so the index and the
// policies can depend on it. The ZeroMQ subscriber is in the subpackage
// kvevents, the /metrics reader in enginemetrics. A BlockHasher reuses
// buffers and is not safe for concurrent use; everything else is stateless.
package vllm
