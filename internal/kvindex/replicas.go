package kvindex

import "sync/atomic"

// replicas maps caller names to dense ReplicaIDs. Its owner locks.
type replicas struct {
	byName  map[string]ReplicaID
	names   []string // by ID; "" = free
	free    []ReplicaID
	parents []parentCount // by ID (unknown.go)
}

func newReplicas() replicas { return replicas{byName: make(map[string]ReplicaID)} }

// add returns name's ID, assigning one (the lowest free) if needed.
func (r *replicas) add(name string) (ReplicaID, bool) {
	if id, ok := r.byName[name]; ok {
		return id, false
	}
	var id ReplicaID
	if n := len(r.free); n > 0 {
		id = r.free[n-1]
		r.free = r.free[:n-1]
		r.names[id] = name
	} else {
		id = ReplicaID(len(r.names))
		r.names = append(r.names, name)
		r.parents = append(r.parents, parentCount{})
	}
	r.parents[id] = parentCount{}
	r.byName[name] = id
	return id, true
}

func (r *replicas) remove(name string) (ReplicaID, bool) {
	id, ok := r.byName[name]
	if !ok {
		return 0, false
	}
	delete(r.byName, name)
	r.names[id] = ""
	r.free = append(r.free, id)
	return id, true
}

// counters are the Stats atomics: written by the index's writer under its
// lock, read by Stats and the metrics collector without it.
type counters struct {
	entries, keys, replicas, bytes                              atomic.Int64
	batches, stored, duplicates, hitReports, removed, cleared   atomic.Int64
	evicted, unknownParent, unknownRemoved, mismatched, skipped atomic.Int64
	predicted, confirmed, expired, cancelled, predictedLive     atomic.Int64
}

func (c *counters) stats() Stats {
	return Stats{
		Entries: c.entries.Load(), Keys: c.keys.Load(), Replicas: c.replicas.Load(), Bytes: c.bytes.Load(),
		Batches: c.batches.Load(), Stored: c.stored.Load(), Duplicates: c.duplicates.Load(),
		HitReports: c.hitReports.Load(), Removed: c.removed.Load(), Cleared: c.cleared.Load(),
		Evicted: c.evicted.Load(), UnknownParent: c.unknownParent.Load(), UnknownRemoved: c.unknownRemoved.Load(),
		Mismatched: c.mismatched.Load(), OtherGroups: c.skipped.Load(),
		Predicted: c.predicted.Load(), Confirmed: c.confirmed.Load(), Expired: c.expired.Load(),
		Cancelled: c.cancelled.Load(), PredictedLive: c.predictedLive.Load(),
	}
}
