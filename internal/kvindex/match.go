package kvindex

// ReplicaID numbers a replica densely within one index, from 0. IDs are
// assigned by AddReplica and reused after RemoveReplica.
type ReplicaID int32

// Match is one replica's share of a key sequence: the leading run of blocks
// it holds or has predicted, counted once per block on the block's best tier.
// Blocks() = GPU + Predicted + CPU + Storage is the run's length in blocks.
type Match struct {
	GPU       int32 // blocks held on GPU
	Predicted int32 // blocks not held but predicted (routed there moments ago)
	CPU       int32 // blocks held only on CPU (offloaded)
	Storage   int32 // blocks held only on disk/remote storage
	last      uint8 // tier of the run's last block, for upgrades during Lookup
}

// Blocks returns the length of the leading run in blocks.
func (m Match) Blocks() int { return int(m.GPU + m.Predicted + m.CPU + m.Storage) }

func (m *Match) add(t uint8, d int32) {
	switch t {
	case tierGPU:
		m.GPU += d
	case tierPredicted:
		m.Predicted += d
	case tierCPU:
		m.CPU += d
	case tierStorage:
		m.Storage += d
	}
}

// visit credits block i of the sequence, found on tier t, to m. It reports
// whether the replica's run grew to i+1.
func (m *Match) visit(i int32, t uint8) bool {
	switch n := m.GPU + m.Predicted + m.CPU + m.Storage; {
	case n == i:
		m.add(t, 1)
		m.last = t
		return true
	case n == i+1 && t < m.last:
		m.add(m.last, -1)
		m.add(t, 1)
		m.last = t
	}
	return false
}

// resize returns out with length n, zeroed, reusing its array when possible.
func resize(out []Match, n int) []Match {
	if cap(out) < n {
		out = make([]Match, n)
	}
	out = out[:n]
	clear(out)
	return out
}

// walk credits the holders of key k (block i) in st to out and returns how
// many replicas' runs grew. Entries whose aux < expired are skipped when
// expired != 0 (approximate and predicted entries keep their expiry in aux).
func walk(st *store, k Key, i int32, out []Match, tier uint8, expired uint64) int {
	grew := 0
	for idx := st.head(k); idx != 0; {
		e := st.ent(idx)
		idx = e.next
		if expired != 0 && e.aux < expired {
			continue
		}
		r := st.srcs[e.src].replica
		if int(r) >= len(out) {
			continue
		}
		t := tier
		if t == tierGPU {
			if t = bestTier(&e.refs); t == tierNone {
				continue
			}
		}
		if out[r].visit(i, t) {
			grew++
		}
	}
	return grew
}

// finish clears Lookup's scratch state so that Matches compare by value.
func finish(out []Match) []Match {
	for i := range out {
		out[i].last = 0
	}
	return out
}
