package tokenizer

import (
	"errors"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/zeebo/xxh3"
)

// Prefix cache: a multi-turn chat resends its history with each turn, so
// the rendered prompt of turn n+1 starts with the rendered prompt of turn
// n up to its generation prompt. PrefixCache keeps the token ids of such
// prefixes, so a continuation encodes only what follows.
//
// Exactness. Encode splits the text on added tokens first (leftmost
// longest, non-overlapping) and encodes each piece between them on its
// own. Take a cut c where an added-token segment starts, in a tokenizer
// whose non-normalized added tokens have no lstrip, rstrip or single_word
// flag. The segments before c depend only on text[:c]: a match that began
// before c and read past it would cover c, and no segment could start
// there. So two texts with the same bytes before c, each with an
// added-token segment starting at c, have the same segments, and the
// same ids, before c. The cache is keyed by a 128-bit hash (xxh3) and the
// length of text[:c], stores the ids of the last cut of each prompt it
// encodes, and on a later prompt takes the longest of its cuts it holds.
// Tokenizers with flagged added tokens are never cut (every call encodes
// in full).

// PrefixCacheConfig configures NewPrefixCache.
type PrefixCacheConfig struct {
	// MaxBytes bounds the ids held (4 bytes per id of the arrays entries
	// keep, which may run a few ids past the prefix, plus 64 per entry);
	// the least recently used entries go first. Zero means 64 MiB.
	MaxBytes int64
	// Model labels the metrics.
	Model string
}

// DefaultPrefixCacheBytes is PrefixCacheConfig.MaxBytes's default: the
// prefixes of about 145 conversations of 100K tokens with their block
// keys (16 tokens per block).
const DefaultPrefixCacheBytes = 64 << 20

// prefixEntryOverhead is what an entry costs besides its ids (key, list
// links, slice header, map slot), counted in MaxBytes.
const prefixEntryOverhead = 64

// PrefixCache holds the token ids of rendered chat prefixes. It is safe for
// concurrent use.
type PrefixCache struct {
	max int64
	m   prefixMetrics

	mu         sync.Mutex
	bytes      int64
	entries    map[prefixKey]*prefixEntry
	lens       map[int]int  // entries by key length (prefixKey.n)
	head, tail *prefixEntry // most and least recently used
}

// prefixKey identifies text[:n] by n and its xxh3-128 hash.
type prefixKey struct {
	hash xxh3.Uint128
	n    int
}

type prefixEntry struct {
	key        prefixKey
	ids        []uint32
	held       int // ids the entry keeps alive: len(ids) and any array beyond
	prev, next *prefixEntry
	// keys are a router's block keys of ids (PrefixMemo), nil until set;
	// written under the cache's lock, read without it.
	keys  atomic.Pointer[memoKeys]
	nkeys int // len(keys.Load().keys), under the cache's lock
}

// memoKeys are block keys of an entry's ids, kept under a caller's tag.
type memoKeys struct {
	tag  uint64
	keys []uint64
}

func (e *prefixEntry) size() int64 {
	return int64(e.held)*4 + int64(e.nkeys)*8 + prefixEntryOverhead
}

// prefixMetrics are kvrouter_tokenizer_prefix_cache_*{model}.
type prefixMetrics struct {
	hits, misses prometheus.Counter
	hitTokens    prometheus.Counter
	hitKeys      prometheus.Counter
	bytes        prometheus.Gauge
}

// NewPrefixCache returns an empty cache whose metrics are registered on
// reg (nil: not registered): kvrouter_tokenizer_prefix_cache_hits_total
// and _misses_total (chat encodes that found a cached prefix, or did
// not), _hit_tokens_total (ids taken from the cache instead of encoded)
// and _bytes (held, as MaxBytes counts them). A second cache of the same
// model on one registry is an error.
func NewPrefixCache(cfg PrefixCacheConfig, reg prometheus.Registerer) (*PrefixCache, error) {
	if cfg.MaxBytes < 0 {
		return nil, errors.New("prefix cache: negative max bytes")
	}
	if cfg.MaxBytes == 0 {
		cfg.MaxBytes = DefaultPrefixCacheBytes
	}
	labels := prometheus.Labels{"model": cfg.Model}
	c := &PrefixCache{
		max:     cfg.MaxBytes,
		entries: map[prefixKey]*prefixEntry{},
		lens:    map[int]int{},
		m: prefixMetrics{
			hits: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvrouter_tokenizer_prefix_cache_hits_total",
				Help: "Chat prompts whose leading token ids came from the prefix cache.", ConstLabels: labels}),
			misses: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvrouter_tokenizer_prefix_cache_misses_total",
				Help: "Chat prompts encoded in full (no cached prefix).", ConstLabels: labels}),
			hitTokens: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvrouter_tokenizer_prefix_cache_hit_tokens_total",
				Help: "Token ids taken from the prefix cache instead of encoded.", ConstLabels: labels}),
			hitKeys: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvrouter_tokenizer_prefix_cache_hit_keys_total",
				Help: "Block keys taken from the prefix cache instead of hashed.", ConstLabels: labels}),
			bytes: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvrouter_tokenizer_prefix_cache_bytes",
				Help: "Bytes the prefix cache holds (4 per token id, 8 per block key, 64 per entry).", ConstLabels: labels}),
		},
	}
	if reg != nil {
		for _, col := range []prometheus.Collector{c.m.hits, c.m.misses, c.m.hitTokens, c.m.hitKeys, c.m.bytes} {
			if err := reg.Register(col); err != nil {
				return nil, err
			}
		}
	}
	return c, nil
}

// get returns the entry cached for k (its ids shared: not to be
// modified), or nil.
func (c *PrefixCache) get(k prefixKey) *prefixEntry {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.entries[k]
	if e == nil {
		return nil
	}
	c.unlink(e)
	c.pushFront(e)
	return e
}

// put stores ids (never to be modified from now on) for k, evicting the
// least recently used entries beyond the bound. held is the length of the
// array ids keeps alive (len(ids) or more), as the bound counts it.
func (c *PrefixCache) put(k prefixKey, ids []uint32, held int) *prefixEntry {
	e := &prefixEntry{key: k, ids: ids, held: max(held, len(ids))}
	if e.size() > c.max {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if old := c.entries[k]; old != nil {
		c.unlink(old)
		c.bytes -= old.size()
	} else {
		c.lens[k.n]++
	}
	c.entries[k] = e
	c.pushFront(e)
	c.bytes += e.size()
	c.evict()
	c.m.bytes.Set(float64(c.bytes))
	return e
}

// setKeys keeps k on e, if e is still cached, evicting beyond the bound.
func (c *PrefixCache) setKeys(e *prefixEntry, k *memoKeys) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.entries[e.key] != e {
		return // evicted or replaced meanwhile
	}
	c.bytes += int64(len(k.keys)-e.nkeys) * 8
	e.nkeys = len(k.keys)
	e.keys.Store(k)
	c.evict()
	c.m.bytes.Set(float64(c.bytes))
}

// evict drops the least recently used entries beyond the bound. Caller
// holds c.mu.
func (c *PrefixCache) evict() {
	for c.bytes > c.max && c.tail != nil {
		old := c.tail
		c.unlink(old)
		delete(c.entries, old.key)
		if c.lens[old.key.n]--; c.lens[old.key.n] == 0 {
			delete(c.lens, old.key.n)
		}
		c.bytes -= old.size()
	}
}

// heldLens sets held[i] to whether some entry's prefix is n[i] bytes
// long: a prefix of another length cannot be found, so its hash is not
// needed.
func (c *PrefixCache) heldLens(n []int, held []bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, l := range n {
		held[i] = c.lens[l] > 0
	}
}

func (c *PrefixCache) unlink(e *prefixEntry) {
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		c.head = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		c.tail = e.prev
	}
	e.prev, e.next = nil, nil
}

func (c *PrefixCache) pushFront(e *prefixEntry) {
	e.next = c.head
	if c.head != nil {
		c.head.prev = e
	}
	c.head = e
	if c.tail == nil {
		c.tail = e
	}
}

// cuttable reports whether texts may be cut before added tokens (see the
// exactness note above): no non-normalized added token has lstrip,
// rstrip or single_word.
func (s *tokenSet) cuttable() bool {
	for _, t := range s.toks {
		if t.LStrip || t.RStrip || t.SingleWord {
			return false
		}
	}
	return true
}

// encodeCached is Encode(text, false) through cache: the ids of the
// longest cached prefix ending where an added token starts, then the rest
// encoded; the prefix ending at the text's last added token is stored.
// The memo links the prompt to the entries it came from and made (nil
// without a cache).
func (t *Tokenizer) encodeCached(text string, cache *PrefixCache) ([]uint32, *PrefixMemo) {
	if cache == nil || !t.added.raw.cuttable() {
		return t.Encode(text, false), nil
	}
	text = validUTF8(text)
	sc, _ := t.pool.Get().(*scratch)
	if sc == nil {
		sc = &scratch{}
	}
	sc.segs = t.added.raw.split(sc.segs[:0], text)
	segs := sc.segs
	type cut struct {
		seg  int // index of the added-token segment the cut is before
		key  prefixKey
		held bool // the cache holds a prefix of this length (key hashed)
	}
	cuts := make([]cut, 0, len(segs)/2+1) // at most one per added token
	lens := make([]int, 0, len(segs)/2+1)
	for i, s := range segs {
		if s.id >= 0 && s.start > 0 {
			cuts = append(cuts, cut{seg: i, key: prefixKey{n: s.start}})
			lens = append(lens, s.start)
		}
	}
	held := make([]bool, len(cuts))
	cache.heldLens(lens, held)
	// The text is hashed once, in order; a hash is taken at the cuts that
	// may be found and at the last one, which is stored.
	h := xxh3.New()
	prev := 0
	for j := range cuts {
		if held[j] || j == len(cuts)-1 {
			_, _ = h.WriteString(text[prev:cuts[j].key.n])
			prev = cuts[j].key.n
			cuts[j].key.hash, cuts[j].held = h.Sum128(), held[j]
		}
	}
	var ids []uint32
	from, hit := 0, -1
	memo := &PrefixMemo{c: cache}
	for j := len(cuts) - 1; j >= 0; j-- {
		if !cuts[j].held {
			continue
		}
		if e := cache.get(cuts[j].key); e != nil {
			// The rest is at most one id per byte.
			ids = append(make([]uint32, 0, len(e.ids)+len(text)-cuts[j].key.n+8), e.ids...)
			from, hit = cuts[j].seg, j
			memo.hit = e
			break
		}
	}
	if hit < 0 {
		ids = make([]uint32, 0, len(text)/4+8)
	}
	if hit >= 0 {
		cache.m.hits.Inc()
		cache.m.hitTokens.Add(float64(len(ids)))
	} else {
		cache.m.misses.Inc()
	}
	store := -1 // ids length at the last cut, to store
	last := len(cuts) - 1
	for i := from; i < len(segs); i++ {
		if last >= 0 && last != hit && i == cuts[last].seg {
			store = len(ids)
		}
		ids = t.encodeSegment(ids, text, segs[i], sc)
	}
	sc.front.reset()
	if cap(sc.segs) > maxPooledSegs {
		sc.segs = nil
	}
	t.pool.Put(sc)
	if store >= 0 {
		// The prefix shares ids' array when little of it lies beyond
		// (a continuation: a short tail), else it is copied; the cache
		// counts the whole array it keeps.
		if cap(ids)-store <= store/8 {
			memo.stored = cache.put(cuts[last].key, ids[:store:store], cap(ids))
		} else {
			memo.stored = cache.put(cuts[last].key, slices.Clone(ids[:store]), store)
		}
	} else if last >= 0 && last == hit {
		memo.stored = memo.hit // the prompt's own prefix was cached already
	}
	return ids, memo
}

// maxPooledSegs bounds the segment slice a pooled scratch keeps.
const maxPooledSegs = 1 << 14

// PrefixMemo links one encoded chat prompt to the prefix cache beyond its
// ids, for a router to keep the block keys of cached ids there: the
// entry its leading ids came from (a continuation's previous prompt), and
// the entry stored for its own prefix, which the next turn will find. A
// later turn then hashes only the blocks after the cached prefix. Keys
// are kept under a tag the caller derives from everything its keys depend
// on besides the ids (for kvindex.Keys: root, block size, LoRA,
// cache_salt); they are counted in the cache's bound (8 bytes each) and
// go with their entry. A nil *PrefixMemo keeps nothing. Safe for
// concurrent use.
type PrefixMemo struct {
	c           *PrefixCache
	hit, stored *prefixEntry
}

// Keys returns the block keys kept under tag for the prompt's leading ids
// (key i of block i), or nil. They must not be modified.
func (m *PrefixMemo) Keys(tag uint64) []uint64 {
	if m == nil || m.hit == nil {
		return nil
	}
	k := m.hit.keys.Load()
	if k == nil || k.tag != tag {
		return nil
	}
	m.c.m.hitKeys.Add(float64(len(k.keys)))
	return k.keys
}

// Want returns how many leading blocks of blockSize ids of the prompt the
// memo would keep keys of under tag: those wholly inside the prefix
// stored for the prompt, 0 when there is none or they are kept already.
func (m *PrefixMemo) Want(tag uint64, blockSize int) int {
	if m == nil || m.stored == nil || blockSize <= 0 {
		return 0
	}
	n := len(m.stored.ids) / blockSize
	if k := m.stored.keys.Load(); k != nil && k.tag == tag && len(k.keys) >= n {
		return 0
	}
	return n
}

// SetKeys keeps keys, those of the prompt's first len(keys) blocks (at
// most Want's count), under tag; keys belong to the memo from then on.
// Keys kept before under another tag are replaced.
func (m *PrefixMemo) SetKeys(tag uint64, keys []uint64) {
	if m == nil || m.stored == nil || len(keys) == 0 {
		return
	}
	m.c.setKeys(m.stored, &memoKeys{tag: tag, keys: keys})
}
