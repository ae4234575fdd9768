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

// wordCache holds no pointer per word: the garbage collector marks each
// shard's three arrays, not 128K words and their ids (see vocab.go).
type wordCache struct {
	seed   maphash.Seed
	shards [cacheShards]cacheShard
}

// cacheShard keeps its words' bytes in words and their entries in data:
// [start of the word in words, its length, the number of ids, the ids...].
// at maps a word's 64-bit hash to its entry's index in data; a word whose
// hash another word has replaces it (get compares the bytes). Entries are
// never modified once written, and a full shard starts new arrays rather
// than reusing its old ones, so ids that get returned stay valid.
type cacheShard struct {
	mu    sync.RWMutex
	at    map[uint64]uint32
	words []byte
	data  []uint32
	_     [32]byte // keep shards on separate cache lines
}

func newWordCache() *wordCache {
	c := &wordCache{seed: maphash.MakeSeed()}
	for i := range c.shards {
		c.shards[i].at = make(map[uint64]uint32)
	}
	return c
}

// len is the number of words cached.
func (c *wordCache) len() int {
	n := 0
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.RLock()
		n += len(s.at)
		s.mu.RUnlock()
	}
	return n
}

// get returns w's ids (not to be modified), or false when w is not cached.
func (c *wordCache) get(w string) ([]uint32, bool) {
	h := maphash.String(c.seed, w)
	s := &c.shards[h%cacheShards]
	s.mu.RLock()
	defer s.mu.RUnlock()
	i, ok := s.at[h]
	if !ok {
		return nil, false
	}
	start, n, m := s.data[i], s.data[i+1], s.data[i+2]
	if int(n) != len(w) || string(s.words[start:start+n]) != w {
		return nil, false
	}
	ids := s.data[i+3 : i+3+m]
	return ids[:m:m], true
}

// put stores a copy of ids for w and returns it (never modified after).
func (c *wordCache) put(w string, ids []uint32) []uint32 {
	h := maphash.String(c.seed, w)
	s := &c.shards[h%cacheShards]
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.at) >= cacheEntriesPerShd {
		clear(s.at)
		s.words, s.data = nil, nil // new arrays: returned ids alias the old
	}
	i := uint32(len(s.data))
	s.data = append(s.data, uint32(len(s.words)), uint32(len(w)), uint32(len(ids)))
	s.data = append(s.data, ids...)
	s.words = append(s.words, w...)
	s.at[h] = i
	v := s.data[i+3:]
	return v[:len(ids):len(ids)]
}

// frontCache is a scratch's own two-way set-associative cache in front
// of the shared word cache, for one Encode call: no lock, one cheap hash
// and integer compares per pre-token, where the shared cache takes a
// seeded hash, a read lock and a map lookup. Entries alias the text being
// encoded; reset drops them before the scratch goes back to its pool. A
// word new to its set goes in way 0 and moves the old way 0 to way 1; a
// collision only misses.
type frontCache struct {
	e    [frontSize]frontEntry
	used []uint16 // sets (their way-0 index) filled since the last reset
}

type frontEntry struct {
	k   wordKey
	w   string   // compared itself only when longer than 16 bytes
	ids []uint32 // the shared cache's copy (immutable)
}

const frontBits = 12
const frontSize = 1 << frontBits

// wordKey holds a word's bytes (one of at most maxCachedWord bytes): with
// the word's length it identifies a word of up to 16 bytes exactly (the
// loads cover every byte), and hashes longer ones.
type wordKey struct{ a, b uint64 }

func keyOf(w string) wordKey {
	var k wordKey
	switch n := len(w); {
	case n >= 8:
		k.a, k.b = le64(w), le64(w[n-8:])
	case n >= 4: // two overlapping loads: all the bytes, without a loop
		k.a = uint64(le32(w)) | uint64(le32(w[n-4:]))<<32
	case n > 0:
		k.a = uint64(w[0]) | uint64(w[n>>1])<<8 | uint64(w[n-1])<<16
	}
	return k
}

// frontSet is the way-0 index of the set of the word with key k and
// length n.
func frontSet(k wordKey, n int) int {
	x := (k.a ^ k.b*0xff51afd7ed558ccd ^ uint64(n)) * 0x9e3779b97f4a7c15
	return int(x>>(64-frontBits)) &^ 1
}

// is reports whether e holds w, whose key is k.
func (e *frontEntry) is(k wordKey, w string) bool {
	return len(e.w) == len(w) && e.k == k && (len(w) <= 16 || e.w == w)
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

// get returns the ids of w (key k, in set) if the cache holds them.
func (f *frontCache) get(set int, k wordKey, w string) ([]uint32, bool) {
	if e := &f.e[set]; e.is(k, w) {
		return e.ids, true
	}
	if e := &f.e[set+1]; e.is(k, w) {
		return e.ids, true
	}
	return nil, false
}

// set stores w's ids in way 0 of set, moving way 0's word to way 1.
func (f *frontCache) set(set int, k wordKey, w string, ids []uint32) {
	if f.e[set].w == "" {
		f.used = append(f.used, uint16(set))
	} else {
		f.e[set+1] = f.e[set]
	}
	f.e[set] = frontEntry{k, w, ids}
}

// reset empties the cache (the sets used only).
func (f *frontCache) reset() {
	for _, i := range f.used {
		f.e[i] = frontEntry{}
		f.e[i+1] = frontEntry{}
	}
	f.used = f.used[:0]
}
