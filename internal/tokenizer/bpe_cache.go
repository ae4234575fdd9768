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

func (c *wordCache) put(w string, ids []uint32) {
	v := append([]uint32(nil), ids...)
	k := string([]byte(w)) // own the key: w may alias a large input
	s := c.shard(w)
	s.mu.Lock()
	if len(s.m) >= cacheEntriesPerShd {
		clear(s.m)
	}
	s.m[k] = v
	s.mu.Unlock()
}
