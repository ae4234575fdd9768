package kvindex

import "math/bits"

// maxWords bounds the replica bit sets Lookup keeps on its stack: the fast
// path serves up to 64*maxWords replicas; larger fleets use the per-holder
// walk.
const maxWords = 16

// tierSets are per-block bit sets of replicas by best tier, one word per 64
// replicas.
type tierSets struct{ g, p, c, s [maxWords]uint64 }

// addHolders ORs the holders of key k in st (an exact index's store) into t
// by their best medium: a record's bit sets, or the chain's entries.
func (t *tierSets) addHolders(st *store, k Key, w, n int) {
	v := st.keys.find(st, uint64(k))
	if v&recTag != 0 {
		r := st.rec(v)
		for j := range min(w, st.w) {
			hi, lo := r[2+2*j], r[3+2*j]
			t.g[j] |= hi & lo
			t.c[j] |= hi &^ lo
			t.s[j] |= lo &^ hi
		}
		return
	}
	for idx := v; idx != 0; {
		e := st.ent(idx)
		idx = e.next
		r := int(st.srcs[e.src].replica)
		if r >= n {
			continue
		}
		bit := uint64(1) << (uint(r) & 63)
		j := r >> 6
		switch entryCode(&e.refs) {
		case codeGPU:
			t.g[j] |= bit
		case codeCPU:
			t.c[j] |= bit
		case codeStorage:
			t.s[j] |= bit
		}
	}
}

// lookupSets computes Lookup's result with bit sets: walking keys in order
// it keeps the set of replicas whose run is still going and each one's tier
// at the previous block; a replica's Match is credited only when its tier
// changes or its run ends, so the cost is O(len(keys)*words + tier changes)
// plus one key-table probe per block and store. out has len(out) <= 64*maxWords
// and is zeroed; cov (sorted by l) says how far each replica's predictions
// cover keys.
func lookupSets(st *store, cov []predCover, keys []Key, out []Match) {
	n := len(out)
	w := (n + 63) / 64
	var act [maxWords]uint64
	for j := range w {
		act[j] = ^uint64(0)
	}
	if n%64 != 0 {
		act[w-1] = 1<<(uint(n)%64) - 1
	}
	var pred [maxWords]uint64 // replicas whose predictions cover block i
	for _, c := range cov {
		pred[c.r>>6] |= 1 << (uint(c.r) & 63)
	}
	var prev, cur tierSets // each active replica's tier at the previous and this block
	end := 0
	for i, k := range keys {
		for len(cov) > 0 && cov[0].l <= int32(i) {
			pred[cov[0].r>>6] &^= 1 << (uint(cov[0].r) & 63)
			cov = cov[1:]
		}
		for j := range w {
			cur.g[j], cur.p[j], cur.c[j], cur.s[j] = 0, pred[j], 0, 0
		}
		cur.addHolders(st, k, w, n)
		alive := uint64(0)
		for j := range w {
			a := act[j]
			g := cur.g[j] & a
			p := cur.p[j] &^ g & a
			c := cur.c[j] &^ (g | p) & a
			s := cur.s[j] &^ (g | p | c) & a
			for ch := (g ^ prev.g[j]) | (p ^ prev.p[j]) | (c ^ prev.c[j]) | (s ^ prev.s[j]); ch != 0; ch &= ch - 1 {
				b := bits.TrailingZeros64(ch)
				prev.close(&out[j<<6|b], j, uint64(1)<<b, int32(i))
			}
			prev.g[j], prev.p[j], prev.c[j], prev.s[j] = g, p, c, s
			act[j] = g | p | c | s
			alive |= act[j]
		}
		if alive == 0 {
			return
		}
		end = i + 1
	}
	for j := range w {
		for ch := prev.g[j] | prev.p[j] | prev.c[j] | prev.s[j]; ch != 0; ch &= ch - 1 {
			b := bits.TrailingZeros64(ch)
			prev.close(&out[j<<6|b], j, uint64(1)<<b, int32(end))
		}
	}
}

// close credits m, whose replica had the tier given by its bit in word j of
// t since block m.Blocks(), with the blocks up to i.
func (t *tierSets) close(m *Match, j int, bit uint64, i int32) {
	d := i - int32(m.Blocks())
	switch {
	case t.g[j]&bit != 0:
		m.GPU += d
	case t.p[j]&bit != 0:
		m.Predicted += d
	case t.c[j]&bit != 0:
		m.CPU += d
	case t.s[j]&bit != 0:
		m.Storage += d
	}
}

// Lookup fills out[r] with replica r's Match for keys (a request's Keys, in
// order) and returns out resized to NumReplicas. It allocates only when out
// is too short, or for predictions in fleets beyond 64*maxWords replicas.
func (x *Exact) Lookup(keys []Key, out []Match) []Match {
	x.mu.RLock()
	defer x.mu.RUnlock()
	out = resize(out, len(x.reps.names))
	if len(out) == 0 {
		return out
	}
	if len(out) <= 64*maxWords {
		var buf [64 * maxWords]predCover
		lookupSets(&x.st, x.covers(buf[:0], keys, len(out)), keys, out)
		return out
	}
	return x.lookupWalk(keys, out, x.covers(nil, keys, len(out)))
}

// covers appends to dst how far each replica's predictions cover keys,
// sorted (predictor.covers); dst unchanged when prediction is off or none
// is live. Caller holds x.mu.
func (x *Exact) covers(dst []predCover, keys []Key, n int) []predCover {
	if x.pred == nil || x.c.predictedLive.Load() == 0 {
		return dst
	}
	now := x.cfg.Now().UnixNano()
	x.pred.mu.RLock()
	defer x.pred.mu.RUnlock()
	return x.pred.covers(dst, keys, n, now)
}

// lookupWalk is Lookup for fleets beyond the bit sets' 64*maxWords replicas:
// it visits every holder of every key on the path, and the replicas whose
// predictions cover it (cov, sorted). Caller holds x.mu.
func (x *Exact) lookupWalk(keys []Key, out []Match, cov []predCover) []Match {
	for i, k := range keys {
		grew := walk(&x.st, k, int32(i), out, tierGPU, 0)
		for len(cov) > 0 && cov[0].l <= int32(i) {
			cov = cov[1:]
		}
		for _, c := range cov {
			if out[c.r].visit(int32(i), tierPredicted) {
				grew++
			}
		}
		if grew == 0 {
			break
		}
	}
	return finish(out)
}
