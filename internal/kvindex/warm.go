package kvindex

import "kvrouter/internal/vllm"

// Applying a batch costs a few cache misses per block (table groups, the
// entry, its key's group), each on the previous one's
// result. The warm passes below load, ahead of the real work, what it will
// touch, in loops whose iterations do not depend on each other, so that the
// processor overlaps the misses of many blocks instead of taking them one
// after another. They change nothing; the loaded values only feed x.sink so
// that the compiler keeps the loads. An index of fewer than warmMin entries
// (a few MB with its tables) mostly stays in the processor's caches, where
// the passes are pure overhead, so they are skipped.

// warmMin is the entry count from which Apply warms (Exact.warmFrom, which
// tests change).
const warmMin = 1 << 16

// warmRemovals gathers every BlockRemoved hash of b into x.warmBuf, so that
// the passes of warmWindow run over a compact array: the processor then has
// many more of its loads in flight than a loop over the batch's events would
// allow. The passes run a window of warmChunk removals at a time, just
// before removed() reaches it, so that what they load is still
// in the caches when it is used. Caller holds x.mu.
func (x *Exact) warmRemovals(id ReplicaID, rank int32, b *vllm.Batch) {
	x.warmBuf, x.warmAt, x.warmEnd = x.warmBuf[:0], 0, 0
	if x.st.n < x.warmFrom {
		return
	}
	st := &x.st
	buf := x.warmBuf
	for i := range b.Events {
		ev := &b.Events[i]
		if ev.Type != vllm.BlockRemoved || len(ev.BlockHashes) < 1 {
			continue
		}
		k := srcKey{id, rank, int32(ev.Group())}
		src, ok := x.lastSource(k)
		if !ok {
			src, ok = x.source(id, rank, k.group, false)
		}
		if !ok || st.srcs[src].tab.n == 0 {
			continue
		}
		if len(ev.BlockHashes) == 1 {
			buf = append(buf, warmItem{h: uint64(ev.BlockHashes[0]), src: src})
			continue
		}
		for _, h := range ev.BlockHashes {
			buf = append(buf, warmItem{h: uint64(h), src: src})
		}
	}
	x.warmBuf = buf
}

// warmChunk is the number of removals warmWindow warms at once: enough
// loads in flight to cover a miss's latency, few enough that what they load
// stays in the caches until used.
const warmChunk = 64

// warmWindow touches, for the gathered removals [x.warmEnd, +warmChunk),
// their source-table group, then their entry, then their key's key-table
// home group, and records what it found for removed(). Caller holds x.mu.
func (x *Exact) warmWindow() {
	st := &x.st
	lo := x.warmEnd
	hi := min(len(x.warmBuf), lo+warmChunk)
	x.warmEnd = hi
	buf := x.warmBuf[lo:hi]
	var sink uint64
	for k := range buf {
		w := &buf[k]
		if t := &st.srcs[w.src].tab; t.size() > 0 {
			sink += uint64(t.touch(w.h))
		}
	}
	kmask := uint64(len(st.keys.g) - 1)
	for k := range buf {
		w := &buf[k]
		t := &st.srcs[w.src].tab
		w.slot, w.tslot, w.idx = noWarm, noWarm, 0
		if i := t.slot(st, w.h); i >= 0 {
			w.tslot, w.idx = uint32(i), t.get(i)
			w.slot = uint32(spread(uint64(st.ent(w.idx).key)) & kmask)
		}
	}
	if st.keys.size() > 0 {
		for _, w := range buf {
			if w.slot != noWarm {
				sink += uint64(st.keys.g[w.slot].over)
			}
		}
	}
	x.sink += sink
}

// warmItem is a removal gathered by warmRemovals: the engine hash, its
// source, a key-table group to load (noWarm: none), and the source-table slot
// and entry the hash had then (noWarm, 0: none), for removed().
type warmItem struct {
	h     uint64
	src   uint32
	slot  uint32
	tslot uint32
	idx   uint32
}

const noWarm = ^uint32(0)

// warmStores touches the source-table slots of a BlockStored event's hashes
// and the key-table slots of its keys. Caller holds x.mu.
func (x *Exact) warmStores(src uint32, hs []vllm.BlockHash, keys []Key) {
	t := &x.st.srcs[src].tab
	if len(keys) < 2 || x.st.n < x.warmFrom || t.size() == 0 || x.st.keys.size() == 0 {
		return
	}
	var sink uint64
	for i, k := range keys {
		sink += uint64(t.touch(uint64(hs[i]))) + uint64(x.st.keys.touch(uint64(k)))
	}
	x.sink += sink
}
