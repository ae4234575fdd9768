// Package kvevents follows vLLM engines' KV event streams over ZeroMQ.
//
// A Subscriber owns one engine (all its data-parallel ranks: rank r on
// port+r): it receives [topic, seq8, payload] messages, tracks sequence
// numbers per rank, fills gaps from the engine's replay endpoint with a
// DEALER socket (both the 4-frame and the older 3-frame reply forms), detects
// restarts (a live seq that goes backwards), and hands decoded batches to the
// consumer through a bounded queue. The consumer contract is Update: any
// Reset other than ResetNone means "drop everything known for (Engine, Rank),
// then apply Batch".
//
// Goroutines start only in Subscriber.Run, which returns after they have all
// exited. Metrics (kvrouter_vllm_*, labels engine and rank) live in a
// SubscriberMetrics shared by all subscribers of one registry.
//
// Wire facts: vllm/distributed/kv_events.py (ZmqEventPublisher), vLLM main
// 2026-08-07 and v0.25.1; captured frames in testdata/vllm/frames.md.
package kvevents
