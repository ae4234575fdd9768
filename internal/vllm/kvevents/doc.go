// Package kvevents follows vLLM engines' KV event streams over ZeroMQ.
//
// A Subscriber owns one engine (all its data-parallel ranks: rank r on
// port+r): it receives [topic, seq8, payload] messages, tracks sequence
// numbers per rank, fills gaps from the engine's replay endpoint with a
// DEALER socket (both the 4-frame and the older 3-frame reply forms; replies
// of another topic are skipped, as the SUB filter skips live ones), and
// hands decoded batches to the consumer through a bounded queue. Batches
// that find the queue full are fetched again by replay once it has drained,
// from the last one queued; the rank is reset (ResetOverflow) only when the
// engine no longer buffers them (see overflow.go).
//
// On every connection of a rank (first and later ones) it asks the replay
// endpoint at once, without waiting for a live batch (an idle engine sends
// none): from seq 0 when the consumer holds nothing of the rank (catch-up),
// else from the last applied seq L, whose reply tells the same engine
// process (batch L buffered, byte for byte the one applied) from a new one
// (batch L missing or different: a restart). Restarts are also detected
// when a live seq goes backwards. A reconnection that cannot be checked (no
// replay endpoint, replay failed) is reset conservatively. See reconnect.go
// for every case.
//
// The consumer contract is Update: any Reset other than ResetNone means
// "drop everything known for (Engine, Rank), then apply Batch"; Batch may be
// empty (a reset found on reconnection is handed on at once, without
// waiting for the engine's next batch). Update.Seq and Update.Sum (the
// payload's XXH3) are the batch's Position: a consumer that saved the last
// one it applied (an index snapshot) restarts a Subscriber with
// SubscriberConfig.Resume, and each rank's first connection replays from
// there, checked as a reconnection.
//
// Every connection (live, bound or replay) reads through a limitConn
// (framelimit.go): a ZMTP message larger than MaxMessageBytes (default
// 128 MiB) or of more than 64 frames is refused at its frame header, before
// zmq4 allocates the frame, and the connection is closed and counted.
//
// Goroutines start only in Subscriber.Run, which returns after they have all
// exited. Metrics (kvrouter_vllm_*, labels engine and rank) live in a
// SubscriberMetrics shared by all subscribers of one registry.
//
// Wire facts: vllm/distributed/kv_events.py (ZmqEventPublisher), vLLM main
// 2026-08-07 and v0.25.1; captured frames in testdata/vllm/frames.md.
package kvevents
