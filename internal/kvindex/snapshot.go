package kvindex

import (
	"cmp"
	"fmt"
	"slices"

	"kvrouter/internal/vllm"
)

// Mark is the position in one engine rank's KV event stream of the last
// batch applied to the index: the engine's sequence number and the 64-bit
// XXH3 of the batch's payload bytes (kvevents.Update.Sum). A router that
// restarts from a snapshot asks the engine's replay endpoint for the
// batches after Seq; the batch the engine still buffers under Seq must
// hash to Sum, else the engine is another process that reused the seq.
type Mark struct {
	Seq uint64
	Sum uint64
}

type markKey struct {
	r    ReplicaID
	rank int32
}

// ApplyMarked is Apply for one update of an engine rank's event stream,
// with its bookkeeping in the same atomic step: when reset is true the
// rank's entries (and mark) are dropped first (kvevents.Update.Reset); then
// b is applied, and with m non-nil the rank's mark becomes *m. m nil
// (an update that carries no batch) leaves the mark as the reset left it.
// A Snapshot therefore never holds entries of a batch after its mark, or a
// mark after entries it lacks.
func (x *Exact) ApplyMarked(engine string, rank int, reset bool, b *vllm.Batch, m *Mark) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if reset {
		if id, ok := x.reps.byName[engine]; ok {
			r := int32(rank)
			x.clear(func(k srcKey) bool { return k.r == id && k.rank == r })
			delete(x.marks, markKey{id, r})
		}
	}
	id := x.apply(engine, b)
	if m != nil {
		x.marks[markKey{id, int32(rank)}] = *m
	}
}

// Marks returns the mark of each of engine's ranks that has one, by rank
// (nil when none): where its event stream resumes.
func (x *Exact) Marks(engine string) map[int]Mark {
	x.mu.RLock()
	defer x.mu.RUnlock()
	id, ok := x.reps.byName[engine]
	if !ok {
		return nil
	}
	var out map[int]Mark
	for k, m := range x.marks {
		if k.r == id {
			if out == nil {
				out = map[int]Mark{}
			}
			out[int(k.rank)] = m
		}
	}
	return out
}

// dropMarks deletes the marks matching f. Caller holds x.mu.
func (x *Exact) dropMarks(f func(markKey) bool) {
	for k := range x.marks {
		if f(k) {
			delete(x.marks, k)
		}
	}
}

// Snapshot is the state of an Exact index that a restart needs: per engine
// and data-parallel rank, the mark of the last applied batch and the
// entries that batch and its predecessors left. Predictions, counters and
// eviction order are not kept. Ranks without a mark (fed by Apply, not
// ApplyMarked) are left out: nothing could resume their streams.
type Snapshot struct {
	Model     string           `cbor:"1,keyasint"`
	Pool      string           `cbor:"2,keyasint"`
	BlockSize int              `cbor:"3,keyasint"`
	Root      uint64           `cbor:"4,keyasint"` // Root(Model, Pool)
	Engines   []EngineSnapshot `cbor:"5,keyasint"` // by name
}

// EngineSnapshot is one engine's ranks, in rank order.
type EngineSnapshot struct {
	Name  string         `cbor:"1,keyasint"`
	Ranks []RankSnapshot `cbor:"2,keyasint"`
}

// RankSnapshot is one data-parallel rank: its Mark and its entries per KV
// cache group, in group order.
type RankSnapshot struct {
	Rank   int             `cbor:"1,keyasint"`
	Seq    uint64          `cbor:"2,keyasint"`
	Sum    uint64          `cbor:"3,keyasint"`
	Groups []GroupSnapshot `cbor:"4,keyasint"`
}

// GroupSnapshot is the entries of one (engine, rank, KV cache group) in
// ascending order of the engine's block hash: entry i is the engine's
// block Hashes[i], the router's Key Keys[i], and copies Refs[3i..3i+2] on
// GPU, CPU and STORAGE (not all zero).
type GroupSnapshot struct {
	Group  int      `cbor:"1,keyasint"`
	Hashes []uint64 `cbor:"2,keyasint"`
	Keys   []uint64 `cbor:"3,keyasint"`
	Refs   []uint16 `cbor:"4,keyasint"`
}

// Entries returns the number of entries s holds.
func (s *Snapshot) Entries() int {
	n := 0
	for _, e := range s.Engines {
		for _, r := range e.Ranks {
			for _, g := range r.Groups {
				n += len(g.Hashes)
			}
		}
	}
	return n
}

// Snapshot copies the marked ranks' entries under the read lock (a batch
// being applied is waited for; lookups go on). Its order is canonical: two
// indexes holding the same entries and marks give equal snapshots.
func (x *Exact) Snapshot() *Snapshot {
	x.mu.RLock()
	defer x.mu.RUnlock()
	s := &Snapshot{Model: x.cfg.Model, Pool: x.cfg.Pool, BlockSize: x.cfg.BlockSize, Root: uint64(x.root)}
	byEngine := map[ReplicaID]*EngineSnapshot{}
	for mk, m := range x.marks {
		es := byEngine[mk.r]
		if es == nil {
			es = &EngineSnapshot{Name: x.reps.names[mk.r]}
			byEngine[mk.r] = es
		}
		rs := RankSnapshot{Rank: int(mk.rank), Seq: m.Seq, Sum: m.Sum}
		for k, src := range x.srcOf {
			if k.r == mk.r && k.rank == mk.rank {
				rs.Groups = append(rs.Groups, x.groupSnapshot(int(k.group), src))
			}
		}
		slices.SortFunc(rs.Groups, func(a, b GroupSnapshot) int { return cmp.Compare(a.Group, b.Group) })
		es.Ranks = append(es.Ranks, rs)
	}
	for _, es := range byEngine {
		slices.SortFunc(es.Ranks, func(a, b RankSnapshot) int { return cmp.Compare(a.Rank, b.Rank) })
		s.Engines = append(s.Engines, *es)
	}
	slices.SortFunc(s.Engines, func(a, b EngineSnapshot) int { return cmp.Compare(a.Name, b.Name) })
	return s
}

// groupSnapshot copies source src's entries. Caller holds x.mu.
func (x *Exact) groupSnapshot(group int, src uint32) GroupSnapshot {
	t := &x.st.srcs[src].tab
	idx := make([]uint32, 0, t.n)
	for i := range t.size() {
		if v := t.get(i); v != 0 {
			idx = append(idx, v)
		}
	}
	slices.SortFunc(idx, func(a, b uint32) int { return cmp.Compare(x.st.ent(a).aux, x.st.ent(b).aux) })
	g := GroupSnapshot{Group: group, Hashes: make([]uint64, len(idx)), Keys: make([]uint64, len(idx)), Refs: make([]uint16, 3*len(idx))}
	for i, v := range idx {
		e := x.st.ent(v)
		g.Hashes[i], g.Keys[i] = e.aux, uint64(e.key)
		copy(g.Refs[3*i:], e.refs[:])
	}
	return g
}

// Restore replaces the entries and marks of every engine s names with s's,
// after checking all of s first: it returns an error (and changes nothing)
// when s was taken of another key space (model, pool, block size or root)
// or is inconsistent (see validate). Entries beyond Config.MaxEntries are
// evicted as Apply evicts. Engines s does not name are untouched.
func (x *Exact) Restore(s *Snapshot) error {
	if s.Model != x.cfg.Model || s.Pool != x.cfg.Pool || s.BlockSize != x.cfg.BlockSize || s.Root != uint64(x.root) {
		return fmt.Errorf("%w: taken of model %q pool %q block size %d, not model %q pool %q block size %d",
			ErrSnapshot, s.Model, s.Pool, s.BlockSize, x.cfg.Model, x.cfg.Pool, x.cfg.BlockSize)
	}
	if err := s.validate(); err != nil {
		return err
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	for i := range s.Engines {
		es := &s.Engines[i]
		id, added := x.reps.add(es.Name)
		if added {
			x.c.replicas.Store(int64(len(x.reps.byName)))
		}
		x.clear(func(k srcKey) bool { return k.r == id })
		x.dropMarks(func(k markKey) bool { return k.r == id })
		for _, rs := range es.Ranks {
			x.marks[markKey{id, int32(rs.Rank)}] = Mark{Seq: rs.Seq, Sum: rs.Sum}
			for _, g := range rs.Groups {
				src, _ := x.source(id, int32(rs.Rank), int32(g.Group), true)
				for j, h := range g.Hashes {
					refs := g.Refs[3*j : 3*j+3]
					first := slices.IndexFunc(refs, func(r uint16) bool { return r > 0 })
					idx := x.st.insert(src, Key(g.Keys[j]), h, first)
					for m := first; m < 3; m++ {
						x.st.setRef(idx, m, refs[m])
					}
				}
			}
		}
	}
	for x.st.n > x.cfg.MaxEntries {
		x.st.remove(x.st.oldest(0))
		x.c.evicted.Add(1)
	}
	x.publish()
	return nil
}

// validate checks what Restore relies on: engine names present and
// distinct, ranks in 0..1023 and distinct per engine, groups distinct per
// rank, per group as many keys as hashes and three copy counts per entry
// (not all zero), hashes distinct and ascending.
func (s *Snapshot) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: model %q: %s", ErrSnapshot, s.Model, fmt.Sprintf(format, args...))
	}
	names := map[string]bool{}
	for _, es := range s.Engines {
		if es.Name == "" || names[es.Name] {
			return bad("engine name %q empty or repeated", es.Name)
		}
		names[es.Name] = true
		ranks := map[int]bool{}
		for _, rs := range es.Ranks {
			if rs.Rank < 0 || rs.Rank > 1023 || ranks[rs.Rank] {
				return bad("engine %q: rank %d out of 0..1023 or repeated", es.Name, rs.Rank)
			}
			ranks[rs.Rank] = true
			groups := map[int]bool{}
			for _, g := range rs.Groups {
				if g.Group < 0 || g.Group > 1<<20 || groups[g.Group] {
					return bad("engine %q rank %d: group %d out of range or repeated", es.Name, rs.Rank, g.Group)
				}
				groups[g.Group] = true
				if len(g.Keys) != len(g.Hashes) || len(g.Refs) != 3*len(g.Hashes) {
					return bad("engine %q rank %d group %d: %d hashes, %d keys, %d copy counts",
						es.Name, rs.Rank, g.Group, len(g.Hashes), len(g.Keys), len(g.Refs))
				}
				for j, h := range g.Hashes {
					if j > 0 && h <= g.Hashes[j-1] {
						return bad("engine %q rank %d group %d: hashes not ascending at entry %d", es.Name, rs.Rank, g.Group, j)
					}
					if g.Refs[3*j] == 0 && g.Refs[3*j+1] == 0 && g.Refs[3*j+2] == 0 {
						return bad("engine %q rank %d group %d: entry %d holds no copy", es.Name, rs.Rank, g.Group, j)
					}
				}
			}
		}
	}
	return nil
}
