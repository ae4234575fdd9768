package kvindex

import (
	"fmt"
	"log/slog"
	"sync"

	"kvrouter/internal/vllm"
)

// Exact is the event-fed index of one key space (model and pool), with
// predicted blocks for just-routed requests. See the package doc for the
// model.
//
// Concurrency: every method is safe to call from any number of goroutines.
// The intended use is one goroutine per engine subscriber calling Apply and
// Reset for its engine, while request handlers call Lookup, Routed and
// RoutedMatch. Writers (Apply, Reset, AddReplica, RemoveReplica) are
// serialised by the entry lock, each batch applied atomically: a Lookup sees
// a batch, and the predictions it confirms, either entirely or not at all.
// Lookups run in parallel with each other and with Routed. Apply's
// per-batch scratch (re-hashed keys, confirmations) is used only under the
// entry lock. Lock order: the entry lock, then the prediction lock; no
// method holds the prediction lock while taking the entry lock.
type Exact struct {
	cfg  Config
	root Key
	log  *slog.Logger
	c    counters
	pred *predictor // nil when prediction is off

	mu    sync.RWMutex
	st    store
	reps  replicas
	srcOf map[srcKey]uint32
	// marks is, per (replica, data-parallel rank), the position of the
	// last batch applied through ApplyMarked (snapshot.go).
	marks map[markKey]Mark
	// last source resolved (lastSrc+1; 0: none): batches carry runs of
	// events of one rank and group
	lastKey srcKey
	lastSrc uint32
	// writer scratch
	keyBuf  []Key
	warmBuf []warmItem
	warmAt  int // next warmBuf item removed() consumes
	warmEnd int // warmBuf items before it are warmed (warmWindow)
	// warmFrom is the entry count from which Apply runs the warm passes
	// (warmMin).
	warmFrom int
	sink     uint64 // keeps warm's loads alive
	warned   bool
}

type srcKey struct {
	r           ReplicaID
	rank, group int32
}

// NewExact returns an empty exact index. cfg zero fields take their defaults
// (DefaultConfig); log nil discards; reg nil exports no metrics.
func NewExact(cfg Config, log *slog.Logger, reg Registerer) (*Exact, error) {
	cfg = DefaultConfig(cfg)
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("kvindex: %w", err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	x := &Exact{
		cfg:   cfg,
		root:  Root(cfg.Model, cfg.Pool),
		log:   log.With("model", cfg.Model, "pool", cfg.Pool),
		st:    newStore(false, true, true),
		reps:  newReplicas(),
		srcOf: make(map[srcKey]uint32),
		marks: make(map[markKey]Mark),

		warmFrom: warmMin,
	}
	x.st.clock = true
	x.st.keys.reserve(&x.st, cfg.ExpectedEntries)
	if cfg.PredictTTL > 0 {
		x.pred = newPredictor(cfg.PredictTTL, cfg.MaxPredicted, &x.c)
	}
	if err := newMetrics(reg, "exact", cfg, x.Stats); err != nil {
		return nil, err
	}
	return x, nil
}

// Reserve sizes the key table for n entries (capped at MaxEntries) unless
// it is that large already, rehashing the keys present under the write lock
// (milliseconds per million keys): a router that learns its engines'
// capacity (vLLM's num_gpu_blocks) calls it so that the table does not
// double, stalling lookups, while the index fills. Config.ExpectedEntries
// does the same at creation.
func (x *Exact) Reserve(n int) {
	n = min(n, x.cfg.MaxEntries)
	x.mu.Lock()
	defer x.mu.Unlock()
	x.st.keys.reserve(&x.st, n)
	x.publish()
}

// Root returns the key space's root: Extras.Root for the router's Keys.
func (x *Exact) Root() Key { return x.root }

// BlockSize returns the block size in tokens the index hashes with.
func (x *Exact) BlockSize() int { return x.cfg.BlockSize }

// AddReplica registers name (idempotent) and returns its ID.
func (x *Exact) AddReplica(name string) ReplicaID {
	x.mu.Lock()
	defer x.mu.Unlock()
	id, _ := x.reps.add(name)
	x.c.replicas.Store(int64(len(x.reps.byName)))
	return id
}

// ReplicaID returns name's ID, or false when it is not registered.
func (x *Exact) ReplicaID(name string) (ReplicaID, bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	id, ok := x.reps.byName[name]
	return id, ok
}

// NumReplicas returns the length Lookup gives its output: the highest
// ReplicaID in use plus one.
func (x *Exact) NumReplicas() int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return len(x.reps.names)
}

// RemoveReplica drops every entry and prediction of name and frees its ID.
// It reports whether name was registered.
func (x *Exact) RemoveReplica(name string) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	id, ok := x.reps.remove(name)
	if ok {
		x.clear(func(k srcKey) bool { return k.r == id })
		x.dropMarks(func(k markKey) bool { return k.r == id })
		x.publish()
		// Still under x.mu: the ID cannot be reused (and predicted for)
		// before its old predictions are gone.
		if x.pred != nil {
			x.pred.mu.Lock()
			x.pred.dropReplica(id)
			x.pred.mu.Unlock()
		}
	}
	x.c.replicas.Store(int64(len(x.reps.byName)))
	return ok
}

// Reset drops the entries of engine's data-parallel rank: call it when the
// subscriber detects a restart (sequence going backwards) or a gap it cannot
// replay. The engine stays registered.
func (x *Exact) Reset(engine string, rank int) {
	x.mu.Lock()
	defer x.mu.Unlock()
	id, ok := x.reps.byName[engine]
	if !ok {
		return
	}
	x.clear(func(k srcKey) bool { return k.r == id && k.rank == int32(rank) })
	delete(x.marks, markKey{id, int32(rank)})
	x.publish()
}

// clear drops the sources matching f; the removal slots the warm pass
// found are stale then (their tables emptied or reused). Caller holds x.mu.
func (x *Exact) clear(f func(srcKey) bool) {
	x.warmAt = len(x.warmBuf)
	for k, s := range x.srcOf {
		if !f(k) {
			continue
		}
		x.c.cleared.Add(int64(x.st.clearSource(s)))
		x.st.srcs[s].live = false
		delete(x.srcOf, k)
		x.lastSrc = 0
	}
}

// Apply applies one batch of engine's KV events (engine is the replica name;
// the rank is b.DataParallelRank). Malformed or inconsistent events are
// counted in Stats and skipped; Apply never fails.
func (x *Exact) Apply(engine string, b *vllm.Batch) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.apply(engine, b)
}

// apply is Apply under x.mu; it returns engine's ID.
func (x *Exact) apply(engine string, b *vllm.Batch) ReplicaID {
	id, added := x.reps.add(engine)
	if added {
		x.c.replicas.Store(int64(len(x.reps.byName)))
	}
	x.warmRemovals(id, int32(b.DataParallelRank), b)
	for i := range b.Events {
		ev := &b.Events[i]
		switch ev.Type {
		case vllm.BlockStored:
			x.stored(id, int32(b.DataParallelRank), ev)
		case vllm.BlockRemoved:
			x.removed(id, int32(b.DataParallelRank), ev)
		case vllm.AllBlocksCleared:
			rank := int32(b.DataParallelRank)
			x.clear(func(k srcKey) bool { return k.r == id && k.rank == rank })
		}
	}
	for x.st.n > x.cfg.MaxEntries {
		x.st.remove(x.st.oldest(0))
		x.c.evicted.Add(1)
	}
	x.c.batches.Add(1)
	x.publish()
	return id
}

// publish updates the size gauges but Bytes, which Stats computes (it
// visits every table: too slow for every batch). Caller holds x.mu.
func (x *Exact) publish() {
	x.c.entries.Store(int64(x.st.n))
	x.c.keys.Store(int64(x.st.keys.n))
}

// lastSource returns the last source resolved if it is k's: the per-event
// fast path of source, small enough to be inlined.
func (x *Exact) lastSource(k srcKey) (uint32, bool) {
	return x.lastSrc - 1, x.lastSrc != 0 && x.lastKey == k
}

// source returns the source of (id, rank, group), creating it when create
// is set; ok is false when it does not exist. Batches carry runs of events
// of one source: the last one resolved is answered without the map.
func (x *Exact) source(id ReplicaID, rank, group int32, create bool) (uint32, bool) {
	k := srcKey{id, rank, group}
	if s, ok := x.lastSource(k); ok {
		return s, true
	}
	if s, ok := x.srcOf[k]; ok {
		x.lastKey, x.lastSrc = k, s+1
		return s, true
	}
	if !create {
		return 0, false
	}
	s := x.st.addSource(id, rank, group)
	x.srcOf[k] = s
	x.lastKey, x.lastSrc = k, s+1
	return s, true
}

func (x *Exact) stored(id ReplicaID, rank int32, ev *vllm.Event) {
	if !ev.IsFullAttention() {
		x.c.skipped.Add(1)
		return
	}
	n := len(ev.BlockHashes)
	if n == 0 {
		return
	}
	m := ev.Tier()
	src, _ := x.source(id, rank, int32(ev.Group()), true)
	if len(ev.TokenIDs) == 0 {
		// A tokenless store (offload placeholder): only blocks the engine
		// stored before on another medium can be placed.
		for _, h := range ev.BlockHashes {
			if idx := x.st.find(src, uint64(h)); idx != 0 {
				x.st.setRef(idx, int(m), satInc(x.st.ent(idx).refs[m]))
				x.st.touch(idx)
				x.c.duplicates.Add(1)
			} else {
				x.c.unknownParent.Add(1)
			}
		}
		return
	}
	bs := x.cfg.BlockSize
	if (ev.BlockSize != 0 && ev.BlockSize != bs) || len(ev.TokenIDs) != n*bs ||
		(ev.ExtraKeys != nil && len(ev.ExtraKeys) != n) {
		x.c.mismatched.Add(1)
		if !x.warned {
			x.warned = true
			x.log.Warn("kv event does not match the index block size; skipping such events",
				"block_size", bs, "event_block_size", ev.BlockSize, "blocks", n, "tokens", len(ev.TokenIDs))
		}
		return
	}
	parent := x.root
	if ev.ParentBlockHash != nil {
		pidx := x.st.find(src, uint64(*ev.ParentBlockHash))
		if pidx == 0 {
			x.unknownParent(id, rank, *ev.ParentBlockHash)
			return
		}
		parent = x.st.ent(pidx).key
	}
	x.reps.parents[id].known++
	lora := ""
	if ev.LoRAName != nil {
		lora = *ev.LoRAName
	}
	keys := x.keyBuf[:0]
	plain := ev.ExtraKeys == nil && lora == ""
	for i := range n {
		seed := uint64(parent) // eventSeed of a block without extras
		if !plain {
			var extra []any
			if ev.ExtraKeys != nil {
				extra = ev.ExtraKeys[i]
			}
			var ok bool
			if seed, ok = eventSeed(parent, extra, lora, ev.ExtraKeys != nil); !ok {
				x.c.mismatched.Add(1)
				x.keyBuf = keys
				return
			}
		}
		parent = Key(hashTokens(ev.TokenIDs[i*bs:(i+1)*bs], seed))
		keys = append(keys, parent)
	}
	x.keyBuf = keys
	x.warmStores(src, ev.BlockHashes, keys)
	hit := false
	if ev.ParentBlockHash == nil {
		if idx := x.st.find(src, uint64(ev.BlockHashes[0])); idx != 0 && x.st.ent(idx).refs[m] > 0 {
			hit = true
		}
	}
	// Reverse order so the event's first block ends most recent: eviction
	// then takes deep blocks before the prefixes they depend on.
	for i := n - 1; i >= 0; i-- {
		h, k := ev.BlockHashes[i], keys[i]
		t := &x.st.srcs[src].tab
		slot, sm, found := t.probe(&x.st, uint64(h))
		idx := uint32(0)
		if found {
			idx = t.get(slot)
		}
		if idx != 0 && x.st.ent(idx).key != k {
			// The engine reused a hash for other content: we missed its
			// removal. The new content wins.
			x.st.remove(idx)
			idx, slot = 0, -1
		}
		switch {
		case idx == 0:
			x.st.insertAt(src, k, uint64(h), int(m), slot, sm)
			x.c.stored.Add(1)
		case hit:
			if x.st.ent(idx).refs[m] == 0 {
				x.st.setRef(idx, int(m), 1)
			}
			x.st.touch(idx)
			x.c.hitReports.Add(1)
		default:
			x.st.setRef(idx, int(m), satInc(x.st.ent(idx).refs[m]))
			x.st.touch(idx)
			x.c.duplicates.Add(1)
		}
	}
	if x.pred != nil && x.c.predictedLive.Load() > 0 {
		now := x.cfg.Now().UnixNano()
		x.pred.mu.Lock()
		x.pred.confirm(id, keys, now)
		x.pred.mu.Unlock()
	}
}

func (x *Exact) removed(id ReplicaID, rank int32, ev *vllm.Event) {
	m := ev.Tier()
	k := srcKey{id, rank, int32(ev.Group())}
	src, ok := x.lastSource(k)
	if !ok {
		src, ok = x.source(id, rank, k.group, false)
	}
	if !ok {
		x.c.unknownRemoved.Add(int64(len(ev.BlockHashes)))
		return
	}
	t := &x.st.srcs[src].tab
	for _, h := range ev.BlockHashes {
		// The slot and entry the warm pass found, if this is the next
		// removal gathered and the slot still holds them (a table grown
		// since has other slots).
		i, idx := -1, uint32(0)
		if x.warmAt < len(x.warmBuf) {
			if x.warmAt >= x.warmEnd {
				x.warmWindow()
			}
			if w := &x.warmBuf[x.warmAt]; w.h == uint64(h) && w.src == src {
				x.warmAt++
				if int(w.tslot) < t.size() && t.get(int(w.tslot)) == w.idx {
					i, idx = int(w.tslot), w.idx
				}
			}
		}
		e := x.st.ent(idx)
		if i < 0 || e.aux != uint64(h) {
			// No warm slot, or its entry was removed and reused since.
			i, idx = t.lookup(&x.st, uint64(h))
			if i < 0 {
				x.c.unknownRemoved.Add(1)
				continue
			}
			e = x.st.ent(idx)
		}
		left := e.refs
		if left[m] == 0 {
			x.c.unknownRemoved.Add(1)
			continue
		}
		left[m]--
		if left == [3]uint16{} {
			// The slot is known: delete it without a second probe.
			t.deleteSlot(&x.st, i)
			x.st.dropEntry(idx, e)
			x.c.removed.Add(1)
			continue
		}
		x.st.setRef(idx, int(m), left[m])
	}
}

func satInc(v uint16) uint16 {
	if v == ^uint16(0) {
		return v
	}
	return v + 1
}

// Routed records that a request with keys was just sent to replica id: the
// blocks id does not hold yet are predicted for it (Match.Predicted) until
// confirmed by a BlockStored or Config.PredictTTL passes. No-op when
// prediction is off.
func (x *Exact) Routed(id ReplicaID, keys []Key) { x.routedFrom(id, keys, 0) }

// Cancel drops the pending blocks of prediction p (from RoutedMatch) of a
// request the engine answered with an error, which it will not store,
// keeping those that requests routed before to that replica predicted too.
// It returns how many it dropped (Stats.Cancelled): 0 for the zero
// Prediction, or one confirmed, expired or handed over since.
func (x *Exact) Cancel(p Prediction) int {
	if x.pred == nil || p.seq == 0 {
		return 0
	}
	x.pred.mu.Lock()
	defer x.pred.mu.Unlock()
	return x.pred.cancel(p)
}

// RoutedMatch is Routed for a caller that has just looked keys up: m is id's
// Match from that Lookup. When m has no predicted blocks, its m.Blocks()
// leading blocks are held, so only the blocks after them are checked,
// sparing a second walk of the prompt; otherwise it is Routed. A block of
// that run removed between the Lookup and this call is not predicted. It
// names the prediction for Cancel (the zero Prediction when nothing was
// predicted).
func (x *Exact) RoutedMatch(id ReplicaID, keys []Key, m Match) Prediction {
	held := 0
	if m.Predicted == 0 {
		held = min(max(m.Blocks(), 0), len(keys))
	}
	return x.routedFrom(id, keys, held)
}

// routedFrom is Routed knowing that id holds keys[:held].
func (x *Exact) routedFrom(id ReplicaID, keys []Key, held int) Prediction {
	if x.pred == nil || len(keys) == 0 {
		return Prediction{}
	}
	now := x.cfg.Now().UnixNano()
	// The read lock is held until the prediction is recorded, so that id
	// cannot be removed (and its predictions dropped) in between, which
	// would leave this prediction to a replica that later reuses id.
	x.mu.RLock()
	defer x.mu.RUnlock()
	if int(id) >= len(x.reps.names) || x.reps.names[id] == "" {
		return Prediction{}
	}
	held += x.heldPrefix(id, keys[held:])
	if held == len(keys) {
		return Prediction{}
	}
	x.pred.mu.Lock()
	defer x.pred.mu.Unlock()
	return x.pred.add(id, keys, held, now)
}

// heldPrefix returns how many leading keys id holds on any medium. Caller
// holds x.mu.
func (x *Exact) heldPrefix(id ReplicaID, keys []Key) int {
	for i, k := range keys {
		v := x.st.keys.find(&x.st, uint64(k))
		if v&recTag != 0 {
			if getCode(x.st.rec(v), id) == codeNone {
				return i
			}
			continue
		}
		found := false
		for idx := v; idx != 0; idx = x.st.ent(idx).next {
			e := x.st.ent(idx)
			if x.st.srcs[e.src].replica == id && e.refs != [3]uint16{} {
				found = true
				break
			}
		}
		if !found {
			return i
		}
	}
	return len(keys)
}
