package group

import (
	"fmt"
	"slices"

	"kvrouter/internal/kvindex"
	"kvrouter/internal/vllm"
)

// Snapshot returns a snapshot of the group's exact index (nil when the
// group routes with the approximate index).
func (b *Backend) Snapshot() *kvindex.Snapshot {
	if g := b.cur.Load(); g.exact != nil {
		return g.exact.Snapshot()
	}
	return nil
}

// Restore takes a snapshot of this group's exact index, taken by an
// earlier run, before the group's engines are added: it is checked whole
// (model, pool, structure) and kept; each engine's part enters the index
// when the engine joins (Resume), so entries of engines no longer in the
// group never do. An index keyed with another block size is rebuilt with
// the snapshot's (the engines then confirm it or rebuild again). On error
// nothing is kept.
func (b *Backend) Restore(s *kvindex.Snapshot) error {
	if !b.cfg.Exact {
		return fmt.Errorf("%w: model %q routes without KV events", kvindex.ErrSnapshot, b.cfg.Model)
	}
	pool := b.cfg.Index.Pool
	if s.Model != b.cfg.Model || s.Pool != pool || s.Root != uint64(kvindex.Root(b.cfg.Model, pool)) {
		return fmt.Errorf("%w: taken of model %q pool %q, not model %q pool %q", kvindex.ErrSnapshot, s.Model, s.Pool, b.cfg.Model, pool)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if g := b.cur.Load(); g.blockSize != s.BlockSize {
		ng, err := b.build(s.BlockSize)
		if err != nil {
			return fmt.Errorf("%w: block size %d: %v", kvindex.ErrSnapshot, s.BlockSize, err)
		}
		b.cur.Store(ng)
	}
	pending := map[string]*kvindex.Snapshot{}
	for _, es := range s.Engines {
		pending[es.Name] = &kvindex.Snapshot{Model: s.Model, Pool: s.Pool, BlockSize: s.BlockSize, Root: s.Root,
			Engines: []kvindex.EngineSnapshot{es}}
	}
	b.repMu.Lock()
	b.pending = pending
	b.repMu.Unlock()
	return nil
}

// Resume returns where engine's KV event subscriber starts, per rank: the
// marks of the batches its index entries were last applied from. An
// engine restored from a snapshot (Restore) enters the index here, once;
// a data-parallel engine (dp_size > 1) by each of its rank replicas
// (ranks.go), whose entries and marks the index keeps under the rank
// replica's name (found by name: Resume runs before the pool adds the
// engine with its dp_size). Nil: start from nothing.
func (b *Backend) Resume(engine string) map[int]vllm.Position {
	g := b.cur.Load()
	if g.exact == nil {
		return nil
	}
	var out map[int]vllm.Position
	for _, name := range b.resumeNames(engine) {
		b.repMu.Lock()
		s := b.pending[name]
		delete(b.pending, name)
		b.repMu.Unlock()
		if s != nil {
			if err := g.exact.Restore(s); err != nil {
				// Only a block size rebuilt since Restore: the engine starts cold.
				b.log.Warn("snapshot not restored for engine: the index was rebuilt since", "engine", name, "err", err)
				continue
			}
			b.log.Info("engine restored from snapshot", "engine", name, "entries", s.Entries())
		}
		for r, m := range g.exact.Marks(name) {
			if out == nil {
				out = make(map[int]vllm.Position)
			}
			out[r] = vllm.Position{Seq: m.Seq, Sum: m.Sum}
		}
	}
	return out
}

// resumeNames returns the index replicas of engine a resume covers: the
// engine's own name, its rank replicas (engine#dpN) the snapshot holds,
// and those of its dp_size when known.
func (b *Backend) resumeNames(engine string) []string {
	names := b.replicaNames(engine)
	if !slices.Contains(names, engine) {
		names = append(names, engine)
	}
	b.repMu.Lock()
	defer b.repMu.Unlock()
	for name := range b.pending {
		if e, _, ok := SplitRankReplica(name); ok && e == engine && !slices.Contains(names, name) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}
