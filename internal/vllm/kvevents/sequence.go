package kvevents

// seqTracker follows the sequence numbers of one (engine, rank) stream. It
// is pure bookkeeping, owned by one goroutine, not safe for concurrent use.
//
// Two high-water marks are kept, as frames.md §4 requires:
//   - lastLive, the last seq seen on the live SUB stream. Within one engine
//     process live seqs only rise, so a live seq <= lastLive means the engine
//     restarted (seq is itertools.count() in the publisher process).
//   - applied, the highest seq handed to the consumer, live or replayed.
//     Replayed seqs are not used for restart detection: after a replay the
//     same seqs still arrive live and are duplicates, skipped by applied.
//
// An epoch is one engine process. At the start of an epoch (first message
// ever, after a restart, or after any reset on reconnection, which starts
// from a zero seqTracker) nothing of that epoch has been applied; a missing
// prefix of the epoch is then caught up by replay if possible, and losing it
// costs nothing already indexed, so it is not a state-losing gap.
type seqTracker struct {
	haveLive    bool
	lastLive    uint64
	haveApplied bool
	applied     uint64
}

// liveStep is what a live seq means for the stream.
type liveStep struct {
	// restart: the seq went backwards; the engine's state is gone and the
	// tracker has started a new epoch.
	restart bool
	// dup: the seq was already applied (it arrived earlier by replay).
	dup bool
	// missing: seqs [missFrom, seq) of this epoch have not been applied.
	missing  bool
	missFrom uint64
	// fresh: nothing of this epoch was applied before, so a missing prefix
	// loses no indexed state (a catch-up, not a gap).
	fresh bool
}

// live records a seq received on the live stream and says what to do.
func (t *seqTracker) live(seq uint64) liveStep {
	restart := false
	if t.haveLive && seq <= t.lastLive {
		restart = true
		t.haveApplied = false
	}
	t.haveLive, t.lastLive = true, seq
	st := t.step(seq)
	st.restart = restart
	return st
}

// step says what a batch with this seq means against the applied mark
// (duplicate, or after missing seqs), without recording anything.
func (t *seqTracker) step(seq uint64) liveStep {
	var st liveStep
	if !t.haveApplied {
		st.fresh = true
		st.missing, st.missFrom = seq > 0, 0
		return st
	}
	switch {
	case seq <= t.applied:
		st.dup = true
	case seq > t.applied+1:
		st.missing, st.missFrom = true, t.applied+1
	}
	return st
}

// accept records that the batch with this seq (live or replayed) is handed
// to the consumer. isNew is false when it was already applied (skip it).
// hole is true when seqs between the last applied one and this one were
// never applied and the epoch already had applied batches: indexed state is
// then missing events for good.
func (t *seqTracker) accept(seq uint64) (isNew, hole bool) {
	if t.haveApplied {
		if seq <= t.applied {
			return false, false
		}
		hole = seq > t.applied+1
	}
	t.haveApplied, t.applied = true, seq
	return true, hole
}

// next returns the seq expected next in this epoch (0 when none applied).
func (t *seqTracker) next() uint64 {
	if !t.haveApplied {
		return 0
	}
	return t.applied + 1
}
