package kvindex

import "kvrouter/internal/vllm"

// A BlockStored whose parent hash the index never saw for that engine rank
// is skipped (its blocks cannot be keyed without the parent's Key). A few
// are normal: the router started, or a rank was reset, while requests were
// running, and their next blocks name parents stored before. When they keep
// coming, the engine's cache stays unknown to the index: typically a
// publisher whose "no parent" is a value DecodeBatch does not read as none,
// or whose parent hashes are not the block hashes it stores. That is
// warned about once per engine (replica registration), with the counts, when
// its skipped events reach unknownParentWarnAt and outnumber the ones
// applied; every skipped event is counted in Stats.UnknownParent
// (kvrouter_kvindex_unknown_parent_total).
const unknownParentWarnAt = 100

// parentCount is one replica's BlockStored events (full-attention, with
// tokens) whose parent was resolved or nil (known) and those skipped for an
// unknown parent, and whether the warning was logged.
type parentCount struct {
	known, unknown int64
	warned         bool
}

// unknownParent counts a BlockStored of replica id skipped for its unknown
// parent and warns the first time the replica's skipped events reach
// unknownParentWarnAt and outnumber its applied ones. Caller holds x.mu.
func (x *Exact) unknownParent(id ReplicaID, rank int32, parent vllm.BlockHash) {
	x.c.unknownParent.Add(1)
	pc := &x.reps.parents[id]
	pc.unknown++
	if pc.warned || pc.unknown < unknownParentWarnAt || pc.unknown <= pc.known {
		return
	}
	pc.warned = true
	x.log.Warn("BlockStored events of this engine keep naming parent blocks it never stored: they are skipped, so its cache stays unknown to the index (is the publisher's \"no parent\" nil or 0?)",
		"engine", x.reps.names[id], "rank", rank, "unknown_parent_events", pc.unknown,
		"applied_events", pc.known, "last_parent_block_hash", uint64(parent))
}
