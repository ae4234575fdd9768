package kvindex

// Stats returns the index's counters, after expiring the predictions past
// their time. It takes the locks to expire and to measure Bytes, so it waits
// for a batch being applied.
func (x *Exact) Stats() Stats {
	x.mu.RLock()
	if x.pred != nil {
		now := x.cfg.Now().UnixNano()
		x.pred.mu.Lock()
		x.pred.expire(now)
		x.pred.mu.Unlock()
	}
	s := x.c.stats()
	s.Bytes = x.st.bytes()
	x.mu.RUnlock()
	if x.pred != nil {
		x.pred.mu.RLock()
		s.Bytes += x.pred.bytes()
		x.pred.mu.RUnlock()
	}
	return s
}

// ReplicaBlocks returns how many entries replica id holds (its "tree size").
func (x *Exact) ReplicaBlocks(id ReplicaID) int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.st.replicaEntries(id)
}
