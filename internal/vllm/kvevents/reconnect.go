package kvevents

import (
	"context"
	"errors"
	"kvrouter/internal/vllm"
	"log/slog"
	"time"

	"github.com/zeebo/xxh3"
)

// What a (re)connection may find, and how it is told apart.
//
// A rank's state held by the consumer is everything applied since the last
// reset: batches up to seq L of one engine process. A new connection to the
// engine's PUB may reach that process again (a network blip, a router-side
// reconnect) or a new one (the engine restarted, possibly idle since). The
// live stream cannot tell: an idle engine sends nothing. The replay buffer
// can, because vLLM appends every published batch to it (the same payload
// bytes it sent, kv_events.py) and keeps the last buffer_steps (default
// 10000) of them, so a process that ever published holds its newest batch.
// onConnect therefore asks for replay from L and reads the first reply:
//
//   - seq L with the payload applied as L (compared by the XXH3-64 of the
//     payload, which includes the engine's wall-clock ts): the same
//     process. Batches after L are applied, nothing is reset. One request.
//   - seq L with another payload: a new process that has already published
//     more than L batches. ResetRestart, then replay from 0 for its history.
//     (By seq alone this is the case frames.md §4 calls undetectable.)
//   - nothing at or after L (empty buffer or only older seqs): a process
//     that never published L, so a new one, idle or with fewer batches.
//     ResetRestart, then replay from 0 (possibly empty).
//   - a first seq > L: L is no longer buffered; either the same process
//     published more than buffer_steps batches meanwhile, or a new one did.
//     Both lose state: ResetGapLost, and the replied batches are applied
//     as a new epoch.
//   - the request fails or times out: nothing can be told; ResetReconnect.
//
// Without a replay endpoint nothing can be checked: every reconnection of a
// rank with applied state is a ResetReconnect. That costs the index the
// engine rank's entries on every network blip (they refill from new events)
// and keeps stale entries of a restarted engine from being routed on.
//
// Limits: a new process whose batch L is byte-identical to the old one's
// (same events and the same float64 ts) passes for the old one; a reset
// found here reaches the consumer only once the engine accepts the new
// connection (connect mode: within ReconnectMax of it coming back).

// errNewProcess stops a reconnect check's replay at a batch L that is not
// the one applied as L.
var errNewProcess = errors.New("engine process changed")

// verdict is what a reconnect check's replay says about the engine process.
type verdict uint8

const (
	verdictNone    verdict = iota // no reply at or after the last applied seq (yet)
	verdictSame                   // the last applied batch, unchanged: same process
	verdictChanged                // another batch under the last applied seq: new process
	verdictRolled                 // the last applied seq is no longer buffered
)

// onConnect runs on every new connection of this rank (first and later
// ones), before any of its messages. With a replay endpoint it asks for the
// engine's buffered history at once rather than waiting for a live batch
// (an idle engine sends none): from 0 when the consumer holds nothing of
// this rank, else from the last applied seq to check that the engine
// process is the same (see above). Without one, a reconnection of a rank
// with applied state is reset conservatively. A reset that no batch
// follows is handed to the consumer at once (flushReset). A rank behind
// (overflow.go) stops being so: the replay made here catches it up.
func (r *rank) onConnect(ctx context.Context, conn uint64) {
	r.conn = conn
	r.setBehind(false)
	switch {
	case !r.seq.haveApplied:
		// First connection, or everything was reset since: catch up.
		if r.replay != nil {
			r.fill(ctx, 0, true)
		}
	case r.replay == nil:
		r.count(&r.s.stats.unrecoverable, r.m.unrecoverable)
		r.log.Warn("reconnected without a replay endpoint: cannot tell whether the engine restarted, dropping this rank's state",
			"last_seq", r.seq.applied)
		r.newEpoch(ResetReconnect)
	default:
		r.checkReconnect(ctx)
	}
	if ctx.Err() == nil {
		r.flushReset()
	}
}

// checkReconnect replays from the last applied seq L and decides whether the
// engine process is the one that published L (see the comment above
// errNewProcess).
func (r *rank) checkReconnect(ctx context.Context) {
	last, sum := r.seq.applied, r.lastSum
	v := verdictNone
	r.count(&r.s.stats.replays, r.m.replays)
	res, err := r.replay.replay(ctx, last, func(seq uint64, payload []byte) error {
		if v == verdictNone {
			switch {
			case seq < last:
				return nil // not asked for; vLLM never sends it
			case seq == last:
				if xxh3.Hash(payload) != sum {
					v = verdictChanged
					return errNewProcess
				}
				v = verdictSame
				return nil // applied already
			default:
				v = verdictRolled
				r.count(&r.s.stats.unrecoverable, r.m.unrecoverable)
				r.log.Warn("reconnected: the last applied batch is no longer buffered (new engine process, or more than buffer_steps batches missed), dropping this rank's state",
					"last_seq", last, "first_replayed", seq)
				r.newEpoch(ResetGapLost)
			}
		}
		r.handle(seq, payload, true)
		return r.stopIfBehind()
	})
	if ctx.Err() != nil {
		return
	}
	if err != nil && !errors.Is(err, errNewProcess) && !errors.Is(err, errQueueFull) {
		r.count(&r.s.stats.replayErrors, r.m.replayErrors)
		if v == verdictNone {
			r.count(&r.s.stats.unrecoverable, r.m.unrecoverable)
			r.log.Warn("reconnected: replay failed, cannot tell whether the engine restarted, dropping this rank's state",
				"last_seq", last, "err", err)
			r.newEpoch(ResetReconnect)
			return
		}
		// The process is known; what the replay did not deliver is a gap
		// the next live batch reveals.
		r.log.Warn("reconnected: replay failed part way", "from", last, "replayed", res.batches, "err", err)
		return
	}
	switch v {
	case verdictSame:
		r.log.Info("reconnected to the same engine process", "last_seq", last, "replayed", max(res.batches-1, 0))
	case verdictRolled:
		// Reset and applied above.
	default: // verdictNone, verdictChanged
		r.count(&r.s.stats.restarts, r.m.restarts)
		why := "its replay buffer lacks the last applied batch"
		if v == verdictChanged {
			why = "its replay buffer holds another batch under the last applied seq"
		}
		r.log.Warn("engine restart detected on reconnect: "+why+", dropping this rank's state", "last_seq", last)
		r.newEpoch(ResetRestart)
		r.fill(ctx, 0, true)
	}
}

// newEpoch forgets the rank's sequence state (the next seqs belong to a new
// engine process, or are taken as such), including an overflow being caught
// up, and makes the next Update carry why.
func (r *rank) newEpoch(why ResetReason) {
	r.seq = seqTracker{}
	r.setBehind(false)
	r.dropHW = 0
	r.setPending(why)
}

// flushReset hands a pending reset to the consumer now, in an Update without
// a batch, so that the consumer drops stale state without waiting for the
// engine's next batch. On a full queue the reset stays pending and rides on
// the rank's next Update (nothing is dropped or counted).
func (r *rank) flushReset() {
	if r.pending == ResetNone {
		return
	}
	u := Update{Engine: r.s.cfg.Engine, Rank: r.idx, Reset: r.pending, NoBatch: true, Batch: vllm.Batch{DataParallelRank: r.idx}}
	select {
	case r.s.queue <- u:
		r.pending = ResetNone
	default:
		r.log.Debug("consumer queue full, reset deferred to the next update", "reset", u.Reset.String())
	}
}

// Idle checks (SubscriberConfig.IdleCheck). The live stream drops batches
// silently under load, and a gap shows only when a later batch arrives: a
// drop at the end of a burst stays unnoticed while the engine is idle. So a
// rank idle for IdleCheck asks the replay endpoint for its last applied
// batch L and what follows. Only an answer that starts with L, unchanged,
// is trusted: the batches after it are applied (counted as a gap). Any other
// answer on a standing connection cannot be a restart (a new engine process
// breaks the connection, and the reconnect check handles that), so it means
// a wrong replay endpoint, an empty replay buffer (vLLM's buffer_steps 0) or
// more than buffer_steps batches missed: it is warned once and changes
// nothing. Failures and such answers back the checks off, doubling up to
// maxIdleEvery; each check waits at most idleReplayTimeout, as the rank's
// live messages wait behind it.
const (
	idleReplayTimeout = time.Second
	maxIdleEvery      = 5 * time.Minute
)

// errNotTrusted stops an idle check's replay whose first answer is not the
// last applied batch.
var errNotTrusted = errors.New("replay does not start with the last applied batch")

// checkIdle runs an idle check when the rank has applied state, a replay
// endpoint and a live connection. A rank behind (overflow.go) catches up
// instead when the queue has room: that replay covers trailing drops too.
func (r *rank) checkIdle(ctx context.Context) {
	if r.replay == nil || r.conns.Load() == 0 {
		return
	}
	if r.behind {
		if r.roomy() {
			r.catchUp(ctx)
		}
		return
	}
	if !r.seq.haveApplied {
		return
	}
	ictx, cancel := context.WithTimeout(ctx, min(r.s.cfg.ReplayTimeout, idleReplayTimeout))
	defer cancel()
	last, sum := r.seq.applied, r.lastSum
	trusted := false
	r.count(&r.s.stats.idleChecks, r.m.idleChecks)
	res, err := r.replay.replay(ictx, last, func(seq uint64, payload []byte) error {
		switch {
		case trusted:
			r.handle(seq, payload, true)
			return r.stopIfBehind()
		case seq < last:
			// not asked for; vLLM never sends it
		case seq == last && xxh3.Hash(payload) == sum:
			trusted = true
		default:
			return errNotTrusted
		}
		return nil
	})
	switch {
	case ctx.Err() != nil:
	case err != nil && !errors.Is(err, errNotTrusted) && !errors.Is(err, errQueueFull):
		r.count(&r.s.stats.replayErrors, r.m.replayErrors)
		r.idleFailed(ctx, "idle check: replay failed; checking less often", "last_seq", last, "err", err)
	case !trusted:
		r.idleFailed(ctx, "idle check: the replay endpoint does not hold the last applied batch (wrong replay endpoint? empty replay buffer?); nothing changed, checking less often",
			"last_seq", last)
	default:
		r.idleFailing, r.idleEvery = false, r.s.cfg.IdleCheck
		if missed := res.batches - 1; missed > 0 {
			// Counted as a replay only when it delivered, so that an idle
			// fleet does not grow the replay counters.
			r.count(&r.s.stats.replays, r.m.replays)
			r.count(&r.s.stats.gaps, r.m.gaps)
			r.log.Warn("idle check: batches the live stream dropped, replayed", "last_seq", last, "replayed", missed)
		}
	}
}

// idleFailed logs an idle check that changed nothing (a warning for the
// first of a run, then debug) and doubles the interval to the next one.
func (r *rank) idleFailed(ctx context.Context, msg string, args ...any) {
	lvl := slog.LevelWarn
	if r.idleFailing {
		lvl = slog.LevelDebug
	}
	r.idleFailing = true
	r.idleEvery = min(2*r.idleEvery, maxIdleEvery)
	r.log.Log(ctx, lvl, msg, args...)
}
