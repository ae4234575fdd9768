package vllm

import "fmt"

// What a KV event subscriber (package kvevents) hands its consumer, and the
// bounds of its queue and messages. They live here, beside Batch, so that
// the consumer (the model group's index) and router.yaml's schema need no
// ZeroMQ.

// ResetReason tells the consumer why it must forget what it knows about an
// engine rank before applying an Update's batch.
type ResetReason uint8

// Reset reasons. Any value other than ResetNone means: drop every entry of
// this (engine, rank), then apply the Update's batch as the first of a new
// state.
const (
	// ResetNone: apply the batch on top of the existing state.
	ResetNone ResetReason = iota
	// ResetRestart: the engine process was replaced and the new one's
	// cache holds none of the old blocks (vLLM sends no AllBlocksCleared
	// on restart). Seen either as a live seq going backwards, or on
	// reconnection by replay: the new process's buffer lacks the last
	// applied batch, or holds a different batch under its seq.
	ResetRestart
	// ResetGapLost: batches were lost for good: missed and not replayable
	// (no replay endpoint, replay failed or timed out, or the engine no
	// longer buffers them, also on reconnection), or a batch could not be
	// decoded.
	ResetGapLost
	// ResetOverflow: the consumer queue was full, batches were dropped, and
	// they could not be caught up by replay (no replay endpoint, the replay
	// failed, or the engine no longer buffers the first one dropped).
	ResetOverflow
	// ResetReconnect: the connection to the engine rank was re-established
	// and nothing could tell whether the engine process is still the one
	// whose batches were applied (no replay endpoint, or the replay request
	// failed), so its state may be stale: a conservative reset.
	ResetReconnect
)

// String returns "none", "restart", "gap_lost", "overflow" or "reconnect".
func (r ResetReason) String() string {
	switch r {
	case ResetNone:
		return "none"
	case ResetRestart:
		return "restart"
	case ResetGapLost:
		return "gap_lost"
	case ResetOverflow:
		return "overflow"
	case ResetReconnect:
		return "reconnect"
	}
	return fmt.Sprintf("ResetReason(%d)", uint8(r))
}

// Update is one decoded batch handed to the consumer by a KV event subscriber (package kvevents), in sequence order per
// (Engine, Rank). Updates of different ranks interleave.
//
// A reset found while no batch follows (on reconnection: the engine
// restarted and is idle, or the reconnection could not be checked) comes
// at once in an Update without a batch: Reset set, Seq 0, Replayed false,
// Batch{DataParallelRank: Rank} with no events and TS 0. It is not one of
// the engine's batches (not counted in batches); the consumer drops the
// rank's state and applies the empty batch, i.e. nothing. Only when the
// queue is full does such a reset wait for the rank's next Update.
type Update struct {
	// Engine is the subscriber's engine name
	// (kvevents.SubscriberConfig.Engine).
	Engine string
	// Rank is the data-parallel rank of the subscription (port offset) the
	// batch came from. Batch.DataParallelRank is what the engine wrote.
	Rank int
	// Seq is the engine's sequence number of the batch within its process
	// (0 in an Update without a batch).
	Seq uint64
	// Sum is the XXH3-64 of the batch's payload bytes as the engine sent
	// them (0 in an Update without a batch): with Seq, the position a
	// restarted consumer resumes from (kvevents.SubscriberConfig.Resume).
	Sum uint64
	// NoBatch marks an Update without a batch (a reset handed on alone).
	NoBatch bool
	// Replayed is true when the batch came from the replay endpoint rather
	// than the live stream.
	Replayed bool
	// Reset, when not ResetNone, tells the consumer to drop all state of
	// (Engine, Rank) before applying Batch.
	Reset ResetReason
	// Batch is the decoded payload; its Events may be empty (heartbeats).
	Batch Batch
}

// Position is a place in one rank's stream: the seq of a batch and the
// XXH3-64 of its payload (Update.Seq and Update.Sum).
type Position struct {
	Seq uint64
	Sum uint64
}

// Bounds of a KV event subscriber's queue
// (kvevents.SubscriberConfig.QueueSize), in Updates (one decoded batch
// each; an Update is about 100 bytes plus its events).
const (
	DefaultQueueSize = 1024
	MaxQueueSize     = 1 << 20
)

// DefaultMaxMessageBytes is the default bound of one ZeroMQ message a KV
// event subscriber reads (kvevents.SubscriberConfig.MaxMessageBytes): 128
// MiB. vLLM sets no ZMQ_MAXMSGSIZE on its event sockets
// (vllm/distributed/kv_events.py, ZmqEventPublisher._socket_setup sets only
// the send high-water mark), so its own bound is the size of one step's
// batch: a BlockStored carries every token id of its blocks (1 to 5 bytes
// each in msgpack), one step stores at most max_num_batched_tokens new
// tokens (thousands to tens of thousands), and kv_cache_report_mode "full"
// adds the reused prefix of each request scheduled in the step. 128 MiB
// holds more than 25 million token ids in one batch.
const DefaultMaxMessageBytes = 128 << 20

// Bounds of kvevents.SubscriberConfig.MaxMessageBytes: a READY command
// with its metadata must fit below, and no real batch comes near the top.
const (
	MinMaxMessageBytes = 4096
	MaxMaxMessageBytes = 1 << 40
)
