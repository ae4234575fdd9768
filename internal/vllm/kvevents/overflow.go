package kvevents

import (
	"context"
	"errors"

	"github.com/zeebo/xxh3"
)

// A full consumer queue. The reader never blocks on the queue (a blocked
// reader would make the engine's PUB drop silently instead). A batch that
// finds the queue full is not applied; with a replay endpoint the rank goes
// "behind": nothing more of it is queued (so order holds) and every batch
// that arrives meanwhile is counted in queue_drops (each seq once). When the
// consumer has drained the queue to half its size (the apply goroutine
// wakes the rank), or a live batch arrives while it is that empty, the rank
// asks the replay endpoint for everything after the last batch it queued,
// L, and hands it on in order until the queue fills again (behind once
// more, the next catch-up goes on from there) or the replay ends (caught
// up). Nothing is reset while the engine's replay buffer (vLLM
// buffer_steps, default 10000 batches) still holds L+1. The rank's state is
// dropped (ResetOverflow) only when it no longer does: the replay starts
// after L+1 (vLLM then starts at its oldest batch, kv_events.py), holds
// nothing from L+1 on, or fails; a replay that starts late is then applied
// as the rank's new state.
//
// Cost: one replay request per catch-up; each returns the engine's buffer
// from L+1 on, of which about QueueSize/2 batches are queued and the rest
// read no further (the connection is closed). A consumer that stays slower
// than the engine falls behind by more than buffer_steps at last, and the
// rank is reset then; that costs the same as dropping the state at once,
// but later, and only when the consumer cannot keep up on average.
//
// Without a replay endpoint nothing can fetch a dropped batch again: it is
// lost, and the rank's next queued Update carries ResetOverflow.

// errQueueFull stops a replay whose batch found the consumer queue full.
var errQueueFull = errors.New("consumer queue full")

// roomy reports whether the consumer queue is at most half full, the level
// at which a rank behind catches up.
func (r *rank) roomy() bool { return len(r.s.queue) <= r.s.cfg.QueueSize/2 }

// stopIfBehind is the error a replay callback returns after handle: the
// replay stops at the first batch that found the queue full.
func (r *rank) stopIfBehind() error {
	if r.behind {
		return errQueueFull
	}
	return nil
}

// setBehind marks the rank behind (or caught up) and keeps the subscriber's
// count of ranks behind, which the apply goroutine reads to wake them. A
// rank that goes behind while the queue has already drained wakes itself:
// the apply goroutine may have looked before the count went up.
func (r *rank) setBehind(b bool) {
	if r.behind == b {
		return
	}
	r.behind = b
	r.waiting.Store(b)
	if !b {
		r.s.behind.Add(-1)
		return
	}
	r.s.behind.Add(1)
	if r.roomy() {
		r.wakeUp()
	}
}

// wakeUp tells the rank's process goroutine that the queue has room; a
// wake-up already pending is enough.
func (r *rank) wakeUp() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// dropped counts seq in queue_drops unless it was counted before.
func (r *rank) dropped(seq uint64) {
	if seq < r.dropHW {
		return
	}
	r.dropHW = seq + 1
	r.count(&r.s.stats.queueDrops, r.m.queueDrops)
}

// queueFull handles a batch (seq, decoded from payload; want is the seq
// expected next, hole whether seqs want..seq-1 are missing) that found the
// queue full.
func (r *rank) queueFull(seq uint64, payload []byte, want uint64, hole bool) {
	r.dropped(seq)
	if r.replay != nil {
		first := !r.warnedFull
		r.warnedFull = true
		r.setBehind(true)
		msg := "consumer queue full: batches are not queued until it drains, then caught up by replay"
		if first {
			r.log.Warn(msg, "seq", seq, "queue_size", r.s.cfg.QueueSize)
		} else {
			r.log.Debug(msg, "seq", seq)
		}
		return
	}
	// No replay endpoint: the batch is lost for good.
	r.accept(seq, xxh3.Hash(payload))
	if hole {
		r.holeLost(want, seq)
	}
	if r.pending == ResetNone {
		r.pending = ResetOverflow
		r.count(&r.s.stats.overflowResets, r.m.overflowResets)
		msg := "consumer queue full, dropping batches and this rank's state (no replay endpoint to catch up from)"
		if !r.warnedFull {
			r.warnedFull = true
			r.log.Warn(msg, "seq", seq, "queue_size", r.s.cfg.QueueSize)
		} else {
			r.log.Debug(msg, "seq", seq)
		}
	}
}

// catchUp replays everything after the last queued batch and hands it on
// until the queue fills again or the replay ends; it resets the rank when
// the engine's buffer no longer covers what was dropped (see above).
func (r *rank) catchUp(ctx context.Context) {
	from, fresh := r.seq.next(), !r.seq.haveApplied
	r.setBehind(false)
	if r.replay == nil {
		return
	}
	r.count(&r.s.stats.replays, r.m.replays)
	seen := false
	res, err := r.replay.replay(ctx, from, func(seq uint64, payload []byte) error {
		if !seen {
			seen = true
			if seq > from && !fresh {
				r.overflowLost(from, "the engine's replay buffer no longer holds the first batch not queued",
					"first_seq", seq, "lost_batches", seq-from)
				// Same connection, same engine process: keep the live
				// mark (restart detection) and the drop count (the rest
				// are recovered below, as the rank's new state).
				r.seq.haveApplied = false
				r.setPending(ResetOverflow)
			}
		}
		r.handle(seq, payload, true)
		return r.stopIfBehind()
	})
	switch {
	case ctx.Err() != nil:
	case errors.Is(err, errQueueFull):
		r.log.Debug("catch-up stopped: consumer queue full again", "from", from, "replayed", res.batches)
	case err != nil && res.batches == 0 && !fresh:
		r.count(&r.s.stats.replayErrors, r.m.replayErrors)
		r.overflowLost(from, "the catch-up replay failed", "err", err)
		r.newEpoch(ResetOverflow)
		r.flushReset()
	case err != nil:
		// Part delivered (or nothing of this epoch applied yet): what is
		// missing is a gap the next live batch or idle check finds.
		r.count(&r.s.stats.replayErrors, r.m.replayErrors)
		r.log.Warn("catch-up replay failed part way", "from", from, "replayed", res.batches, "err", err)
	case res.batches == 0 && !fresh:
		r.overflowLost(from, "the engine's replay buffer holds nothing from the first batch not queued on")
		r.newEpoch(ResetOverflow)
		r.flushReset()
	default:
		r.log.Debug("caught up after a full consumer queue", "from", from, "to", res.last, "replayed", res.batches)
	}
}

// overflowLost counts and logs an overflow that the engine's replay buffer
// does not cover: the rank's state is dropped.
func (r *rank) overflowLost(from uint64, why string, args ...any) {
	r.count(&r.s.stats.unrecoverable, r.m.unrecoverable)
	r.count(&r.s.stats.overflowResets, r.m.overflowResets)
	r.log.Warn("consumer queue overflow not recoverable: "+why+", dropping this rank's state",
		append([]any{"requested_seq", from}, args...)...)
}
