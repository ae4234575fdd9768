package kvindex

import "unsafe"

// entry is one (key, source) pair: a block a source (an engine's rank and KV
// group, or a replica) holds. Entries live in a slab indexed by uint32; index
// 0 is a sentinel meaning "none".
type entry struct {
	key Key
	// aux is the engine's block hash (exact index) or the expiry time in
	// nanoseconds of Config.Now (approximate and predicted entries).
	aux uint64
	// next links the entries of the same key (all holders of a block).
	next uint32
	src  uint32
	// refs counts copies per medium (vllm.MediumGPU, CPU, Storage).
	refs [3]uint16
	// ref is the CLOCK state of a store with clock set (0 free, refCold,
	// refHot); it sits in what would be padding.
	ref uint8
}

// An entry is 32 bytes, so that the slab's entries never straddle two
// cache lines (at 40 bytes, one in five did: a lookup of it cost two
// misses). The LRU links of a store without clock live beside the slab
// (store.links).
var _ [32 - unsafe.Sizeof(entry{})]struct{}

// link is an entry's place in its LRU list (prev is more recent).
type link struct{ prev, next uint32 }

// CLOCK states of entry.ref.
const (
	refCold uint8 = 1 // live, not stored or reported since the hand passed
	refHot  uint8 = 2 // live, stored or reported since the hand passed
)

const entrySize = int64(unsafe.Sizeof(entry{}))

// Slab chunks hold chunkLen entries.
const (
	chunkShift = 13
	chunkLen   = 1 << chunkShift
)

// ent returns entry idx.
func (s *store) ent(idx uint32) *entry { return &s.ents[idx>>chunkShift][idx&(chunkLen-1)] }

// lnk returns entry idx's LRU links (a store without clock).
func (s *store) lnk(idx uint32) *link { return &s.links[idx>>chunkShift][idx&(chunkLen-1)] }

// source is one producer of entries: an (engine, rank, group) for the exact
// index, a replica for the approximate and predicted ones.
type source struct {
	tab     table // aux (exact) or key -> entry
	replica ReplicaID
	rank    int32
	group   int32
	live    bool
}

// lru is a doubly linked list of entries, head most recent.
type lru struct{ head, tail uint32 }

// store is the slab, the key table, per-source tables and LRU lists shared by
// the three indexes. It is not safe for concurrent use; its owner locks.
type store struct {
	// ents is the slab in chunks of chunkLen entries (the first one grows
	// up to it), so that growing it never copies entries; see ent.
	ents [][]entry
	// links holds the entries' LRU links in chunks parallel to ents; it
	// stays empty with clock, which links nothing.
	links [][]link
	nents uint32 // entries allocated (live and free)
	free  uint32
	keys  table // key -> first holder
	srcs  []source
	lists []lru
	// perSrcLRU keeps one LRU list per source (approximate index: capacity
	// per replica); otherwise list 0 is global.
	perSrcLRU bool
	// clock replaces the LRU list by CLOCK (second chance): touching an
	// entry only marks it hot, removing one unlinks nothing, and oldest
	// sweeps the slab from hand for a cold entry, cooling the hot ones it
	// passes. That spares the two neighbour loads (cache misses in a large
	// index) of every unlink. Only with a single list (perSrcLRU false).
	clock    bool
	hand     uint32
	auxKeyed bool    // source tables keyed by aux (exact) rather than key
	n        int     // live entries
	held     []int32 // live entries by ReplicaID
	holderSets
}

// newStore returns an empty store. useRecs gives keys with recMin or more
// holders a holder record (holders.go); only an index whose entries never
// expire may use them.
func newStore(perSrcLRU, auxKeyed, useRecs bool) store {
	s := store{perSrcLRU: perSrcLRU, auxKeyed: auxKeyed}
	s.ents = [][]entry{make([]entry, 1, 1024)}
	s.nents = 1
	s.lists = make([]lru, 1)
	if useRecs {
		s.initRecs()
	}
	return s
}

func (s *store) listOf(src uint32) *lru {
	if !s.perSrcLRU {
		return &s.lists[0]
	}
	for int(src) >= len(s.lists) {
		s.lists = append(s.lists, lru{})
	}
	return &s.lists[src]
}

// addSource registers a source and returns its id, reusing a dead one.
func (s *store) addSource(r ReplicaID, rank, group int32) uint32 {
	for i := range s.srcs {
		if !s.srcs[i].live && s.srcs[i].tab.n == 0 {
			g := s.srcs[i].tab.g
			clear(g) // saturated overflow counts too
			s.srcs[i] = source{tab: table{g: g, byAux: s.auxKeyed}, replica: r, rank: rank, group: group, live: true}
			return uint32(i)
		}
	}
	s.srcs = append(s.srcs, source{tab: table{byAux: s.auxKeyed}, replica: r, rank: rank, group: group, live: true})
	return uint32(len(s.srcs) - 1)
}

// find returns the entry of src under h (engine hash or key), or 0.
func (s *store) find(src uint32, h uint64) uint32 {
	return s.srcs[src].tab.find(s, h)
}

// head returns the first holder of key, or 0.
func (s *store) head(k Key) uint32 {
	v := s.keys.find(s, uint64(k))
	if v&recTag != 0 {
		return s.recHead(v)
	}
	return v
}

// insert adds a new entry holding one copy on medium m (m < 0: none) and
// makes it the most recent of its list.
func (s *store) insert(src uint32, k Key, aux uint64, m int) uint32 {
	h := uint64(k)
	if s.auxKeyed {
		h = aux
	}
	return s.insertAt(src, k, aux, m, -1, spread(h))
}

// insertAt is insert knowing the empty source-table slot a probe for the
// entry's source-table key returned (slot -1: unknown) and that key's
// spread sm.
func (s *store) insertAt(src uint32, k Key, aux uint64, m int, slot int, sm uint64) uint32 {
	idx := s.free
	if idx != 0 {
		s.free = s.ent(idx).next
	} else {
		idx = s.nents
		c := int(idx >> chunkShift)
		if c == len(s.ents) {
			s.ents = append(s.ents, make([]entry, 0, chunkLen))
		}
		s.ents[c] = append(s.ents[c], entry{})
		if !s.clock {
			for c >= len(s.links) {
				s.links = append(s.links, make([]link, 0, cap(s.ents[len(s.links)])))
			}
			for len(s.links[c]) < len(s.ents[c]) {
				s.links[c] = append(s.links[c], link{})
			}
		}
		s.nents++
	}
	e := s.ent(idx)
	*e = entry{key: k, aux: aux, src: src}
	if m >= 0 {
		e.refs[m] = 1
	}
	sr := &s.srcs[src]
	r := sr.replica
	if s.recs != nil && int(r)>>6 >= s.w {
		s.ensureWords(r)
	}
	if i, km, found := s.keys.probe(s, uint64(k)); found {
		s.link(i, idx)
	} else {
		s.keys.insertAt(s, km, i, idx)
	}
	sr.tab.insertAt(s, sm, slot, idx)
	if s.clock {
		e.ref = refHot // pushFront
	} else {
		s.pushFront(s.listOf(src), idx)
	}
	s.n++
	for int(r) >= len(s.held) {
		s.held = append(s.held, 0)
	}
	s.held[r]++
	return idx
}

func (s *store) pushFront(l *lru, idx uint32) {
	if s.clock {
		s.ent(idx).ref = refHot
		return
	}
	e := s.lnk(idx)
	e.prev, e.next = 0, l.head
	if l.head != 0 {
		s.lnk(l.head).prev = idx
	}
	l.head = idx
	if l.tail == 0 {
		l.tail = idx
	}
}

func (s *store) unlinkLRU(l *lru, idx uint32) {
	if s.clock {
		return
	}
	e := s.lnk(idx)
	if e.prev != 0 {
		s.lnk(e.prev).next = e.next
	} else {
		l.head = e.next
	}
	if e.next != 0 {
		s.lnk(e.next).prev = e.prev
	} else {
		l.tail = e.prev
	}
	e.prev, e.next = 0, 0
}

// touch makes idx the most recent entry of its list.
func (s *store) touch(idx uint32) {
	if s.clock {
		s.ent(idx).ref = refHot
		return
	}
	l := s.listOf(s.ent(idx).src)
	if l.head == idx {
		return
	}
	s.unlinkLRU(l, idx)
	s.pushFront(l, idx)
}

// moveFront makes the entries from first to last, which follow one
// another in l in that order, the most recent of l, in that order: the
// list touching last, then each one before it up to first, would leave.
// first 0 moves nothing. A store without clock only.
func (s *store) moveFront(l *lru, first, last uint32) {
	if first == 0 || l.head == first {
		return
	}
	f, z := s.lnk(first), s.lnk(last)
	p, n := f.prev, z.next // p != 0: first is not the head
	s.lnk(p).next = n
	if n != 0 {
		s.lnk(n).prev = p
	} else {
		l.tail = p
	}
	f.prev, z.next = 0, l.head
	s.lnk(l.head).prev = last
	l.head = first
}

// unlinkKey removes idx from its key's holder chain.
func (s *store) unlinkKey(idx uint32, e *entry) {
	i, v := s.keys.lookupHolder(s, uint64(e.key), idx)
	if i < 0 {
		return
	}
	if v&recTag != 0 {
		s.unlinkRec(i, idx)
		return
	}
	if v == idx {
		if e.next != 0 {
			s.keys.put(i, e.next)
		} else {
			s.keys.deleteSlot(s, i)
		}
		return
	}
	for p := v; p != 0; p = s.ent(p).next {
		if s.ent(p).next == idx {
			s.ent(p).next = e.next
			return
		}
	}
}

// remove deletes entry idx everywhere.
func (s *store) remove(idx uint32) {
	e := s.ent(idx)
	src := &s.srcs[e.src]
	h := uint64(e.key)
	if s.auxKeyed {
		h = e.aux
	}
	if i := src.tab.slot(s, h); i >= 0 {
		src.tab.deleteSlot(s, i)
	}
	s.drop(idx)
}

// drop unlinks idx from its key chain and LRU list and frees it, leaving the
// source table to the caller.
func (s *store) drop(idx uint32) { s.dropEntry(idx, s.ent(idx)) }

// dropEntry is drop given e = s.ent(idx).
func (s *store) dropEntry(idx uint32, e *entry) {
	s.unlinkKey(idx, e)
	if !s.clock {
		s.unlinkLRU(s.listOf(e.src), idx)
	}
	s.held[s.srcs[e.src].replica]--
	*e = entry{next: s.free}
	s.free = idx
	s.n--
}

// clearSource drops every entry of src and returns how many there were.
func (s *store) clearSource(src uint32) int {
	t := &s.srcs[src].tab
	n := 0
	for i := range t.size() {
		if idx := t.get(i); idx != 0 {
			s.drop(idx)
			n++
		}
	}
	t.reset()
	return n
}

// oldest returns the least recent entry of the list of src (or the global
// list), or 0. With clock it is the next cold entry from the hand instead.
func (s *store) oldest(src uint32) uint32 {
	if s.clock {
		return s.sweep()
	}
	return s.listOf(src).tail
}

// sweep advances the CLOCK hand to the next cold live entry, cooling the hot
// ones it passes, and returns it (0 when the store is empty). Every entry it
// passes was stored or reported since the hand last passed it, so a sweep
// costs O(1) amortised.
func (s *store) sweep() uint32 {
	if s.n == 0 {
		return 0
	}
	for {
		s.hand++
		if s.hand >= s.nents {
			s.hand = 1
		}
		e := s.ent(s.hand)
		switch e.ref {
		case refHot:
			e.ref = refCold
		case refCold:
			return s.hand
		}
	}
}

// bytes estimates the memory the store holds.
func (s *store) bytes() int64 {
	b := s.keys.bytes() + int64(cap(s.recs))*8 + int64(cap(s.ents))*24
	for _, c := range s.ents {
		b += int64(cap(c)) * entrySize
	}
	for _, c := range s.links {
		b += int64(cap(c)) * int64(unsafe.Sizeof(link{}))
	}
	for i := range s.srcs {
		b += s.srcs[i].tab.bytes()
	}
	return b + int64(cap(s.srcs))*int64(unsafe.Sizeof(source{})) + int64(cap(s.lists))*8
}

// bestTier returns the best medium holding a copy: 0 GPU, 2 CPU, 3 STORAGE
// (1 is reserved for predicted blocks), or 4 when no copy is left.
func bestTier(r *[3]uint16) uint8 {
	switch {
	case r[0] > 0:
		return tierGPU
	case r[1] > 0:
		return tierCPU
	case r[2] > 0:
		return tierStorage
	}
	return tierNone
}

const (
	tierGPU uint8 = iota
	tierPredicted
	tierCPU
	tierStorage
	tierNone
)

// replicaEntries returns the live entries of replica r.
func (s *store) replicaEntries(r ReplicaID) int {
	if r < 0 || int(r) >= len(s.held) {
		return 0
	}
	return int(s.held[r])
}
