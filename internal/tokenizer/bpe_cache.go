package tokenizer

import (
	"hash/maphash"
	"sync"
)

// Word cache: the ids of recently merged pre-tokens. Bounded (a full shard
// is cleared, which is cheap and keeps the hot words coming back), sharded
// to keep lock contention low, and owned by one Tokenizer.
const (
	cacheShards        = 64
	cacheEntriesPerShd = 2048 // 128K words in all
	maxCachedWord      = 64   // bytes; longer pre-tokens are not cached
)

type wordCache struct {
	seed   maphash.Seed
	shards [cacheShards]cacheShard
}

type cacheShard struct {
	mu sync.RWMutex
	m  map[string][]uint32
	_  [32]byte // keep shards on separate cache lines
}

func newWordCache() *wordCache {
	c := &wordCache{seed: maphash.MakeSeed()}
	for i := range c.shards {
		c.shards[i].m = make(map[string][]uint32)
	}
	return c
}

func (c *wordCache) shard(w string) *cacheShard {
	return &c.shards[maphash.String(c.seed, w)%cacheShards]
}

func (c *wordCache) get(w string) ([]uint32, bool) {
	s := c.shard(w)
	s.mu.RLock()
	ids, ok := s.m[w]
	s.mu.RUnlock()
	return ids, ok
}

// put stores a copy of ids for w and returns it (never modified after).
func (c *wordCache) put(w string, ids []uint32) []uint32 {
	v := append([]uint32(nil), ids...)
	k := string([]byte(w)) // own the key: w may alias a large input
	s := c.shard(w)
	s.mu.Lock()
	if len(s.m) >= cacheEntriesPerShd {
		clear(s.m)
	}
	s.m[k] = v
	s.mu.Unlock()
	return v
}

// frontCache is a scratch's own direct-mapped cache in front of the
// shared word cache, for one Encode call: no lock and one cheap hash per
// pre-token, where the shared cache takes a seeded hash, a read lock and
// a map lookup. Entries alias the text being encoded; reset drops them
// before the scratch goes back to its pool. A collision only misses.
type frontCache struct {
	e    [frontSize]frontEntry
	used []uint16 // slots set since the last reset
}

type frontEntry struct {
	w   string
	ids []uint32 // the shared cache's copy (immutable)
}

const frontBits = 12
const frontSize = 1 << frontBits

// frontSlot hashes w (at most maxCachedWord bytes) to a slot.
func frontSlot(w string) uint16 {
	var x uint64
	switch n := len(w); {
	case n >= 8:
		x = le64(w) ^ le64(w[n-8:])*0xff51afd7ed558ccd
	case n >= 4: // two overlapping loads: all the bytes, without a loop
		x = uint64(le32(w)) | uint64(le32(w[n-4:]))<<32
	case n > 0:
		x = uint64(w[0]) | uint64(w[n>>1])<<8 | uint64(w[n-1])<<16
	}
	x = (x ^ uint64(len(w))) * 0x9e3779b97f4a7c15
	return uint16(x >> (64 - frontBits))
}

func le64(s string) uint64 {
	_ = s[7]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}

func le32(s string) uint32 {
	_ = s[3]
	return uint32(s[0]) | uint32(s[1])<<8 | uint32(s[2])<<16 | uint32(s[3])<<24
}

func (f *frontCache) set(slot uint16, w string, ids []uint32) {
	if f.e[slot].ids == nil {
		f.used = append(f.used, slot)
	}
	f.e[slot] = frontEntry{w, ids}
}

// reset empties the cache (the slots used only).
func (f *frontCache) reset() {
	for _, i := range f.used {
		f.e[i] = frontEntry{}
	}
	f.used = f.used[:0]
}
