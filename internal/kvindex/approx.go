package kvindex

import (
	"fmt"
	"log/slog"
	"math"
	"sync"
)

// Approx is the decision-fed index for engines that publish no KV events.
// It models each replica's prefix cache as the engine runs it: a cache of
// the replica's capacity in blocks (SetCapacity: vLLM's num_gpu_blocks)
// evicting the least recently used block when full. Routed inserts the
// request's keys for the chosen replica, or refreshes those it already
// holds (the engine reuses them and they become most recent), the prefix
// most recent of all, so that deep blocks are evicted before their
// prefixes (vLLM frees a request's blocks in reverse order). Nothing
// expires with time unless Config.ApproxTTL sets an upper bound. Lookup
// reads only: looking up a prompt is not a request to any replica. Its
// blocks count as GPU in Lookup. Safe for concurrent use (one RWMutex).
type Approx struct {
	cfg  Config
	root Key
	log  *slog.Logger
	c    counters

	mu    sync.RWMutex
	st    store
	reps  replicas
	srcOf []uint32 // ReplicaID -> source id + 1
	capOf []int    // ReplicaID -> capacity in blocks
}

// NewApprox returns an empty approximate index. cfg zero fields take their
// defaults (DefaultConfig); log nil discards; reg nil exports no metrics.
func NewApprox(cfg Config, log *slog.Logger, reg Registerer) (*Approx, error) {
	cfg = DefaultConfig(cfg)
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("kvindex: %w", err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	a := &Approx{
		cfg:  cfg,
		root: Root(cfg.Model, cfg.Pool),
		log:  log.With("model", cfg.Model, "pool", cfg.Pool),
		st:   newStore(true, false, false),
		reps: newReplicas(),
	}
	a.st.keys.reserve(&a.st, cfg.ExpectedEntries)
	if err := newMetrics(reg, "approx", cfg, a.Stats); err != nil {
		return nil, err
	}
	return a, nil
}

// Root returns the key space's root: Extras.Root for the router's Keys.
func (a *Approx) Root() Key { return a.root }

// BlockSize returns the block size in tokens the index assumes.
func (a *Approx) BlockSize() int { return a.cfg.BlockSize }

// AddReplica registers name (idempotent) and returns its ID. Its capacity is
// Config.ApproxCapacity until SetCapacity.
func (a *Approx) AddReplica(name string) ReplicaID {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.add(name)
}

func (a *Approx) add(name string) ReplicaID {
	id, added := a.reps.add(name)
	if added {
		for int(id) >= len(a.srcOf) {
			a.srcOf = append(a.srcOf, 0)
			a.capOf = append(a.capOf, 0)
		}
		a.srcOf[id] = a.st.addSource(id, 0, 0) + 1
		a.capOf[id] = a.cfg.ApproxCapacity
		a.c.replicas.Store(int64(len(a.reps.byName)))
	}
	return id
}

// ReplicaID returns name's ID, or false when it is not registered.
func (a *Approx) ReplicaID(name string) (ReplicaID, bool) {
	a.mu.RLock()
	defer a.mu.RUnlock()
	id, ok := a.reps.byName[name]
	return id, ok
}

// NumReplicas returns the length Lookup gives its output.
func (a *Approx) NumReplicas() int {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return len(a.reps.names)
}

// SetCapacity sets name's capacity in blocks (vLLM's num_gpu_blocks from
// vllm:cache_config_info), registering name if needed, and evicts down to it.
func (a *Approx) SetCapacity(name string, blocks int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	id := a.add(name)
	a.capOf[id] = max(blocks, 1)
	a.evict(id, 0)
	a.publish()
}

// RemoveReplica drops name's entries and frees its ID. It reports whether
// name was registered.
func (a *Approx) RemoveReplica(name string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	id, ok := a.reps.remove(name)
	if !ok {
		return false
	}
	src := a.srcOf[id] - 1
	a.c.cleared.Add(int64(a.st.clearSource(src)))
	a.st.srcs[src].live = false
	a.srcOf[id] = 0
	a.c.replicas.Store(int64(len(a.reps.byName)))
	a.publish()
	return true
}

// Routed records that a request with keys was sent to replica id: each key
// becomes id's most recent block (keys[0] the most recent of all), evicting
// its least recent blocks beyond its capacity, and with Config.ApproxTTL
// set, expires that long from now.
func (a *Approx) Routed(id ReplicaID, keys []Key) {
	if len(keys) == 0 {
		return
	}
	now, exp := a.expiry()
	a.mu.Lock()
	defer a.mu.Unlock()
	if int(id) >= len(a.srcOf) || a.srcOf[id] == 0 {
		return
	}
	src := a.srcOf[id] - 1
	a.evict(id, now)
	// Each key in turn, from the last, becomes the most recent. Held
	// blocks that already follow one another in the list in key order (a
	// continued conversation's prefix, routed here before) are moved to
	// the front as one run: the same list, without relinking each.
	l := a.st.listOf(src)
	var run, runEnd uint32 // a run of held keys' entries not yet moved (0: none)
	stored := int64(0)     // counted once: an atomic add per block is not free
	for i := len(keys) - 1; i >= 0; i-- {
		k := keys[i]
		// Most often the key's entry is the one just before the run in
		// the list, where the last Routed of the same prefix left it:
		// an entry of this replica's list (one per key), so the one the
		// probe would find, and the run grows by it. Two loads the
		// probe makes anyway (the entry and its links), no table group.
		if run != 0 {
			if p := a.st.lnk(run).prev; p != 0 {
				if e := a.st.ent(p); e.key == k {
					e.aux = exp
					run = p
					continue
				}
			}
		}
		// One probe of the replica's table: the key's slot when it holds
		// the block, else the free slot the insert takes.
		t := &a.st.srcs[src].tab
		slot, sm, found := t.probe(&a.st, uint64(k))
		if found {
			idx := t.get(slot)
			a.st.ent(idx).aux = exp
			if run != 0 && a.st.lnk(idx).next == run {
				run = idx
				continue
			}
			a.st.moveFront(l, run, runEnd)
			run, runEnd = idx, idx
			continue
		}
		a.st.moveFront(l, run, runEnd)
		run = 0
		a.st.insertAt(src, k, exp, 0, slot, sm)
		stored++
	}
	a.st.moveFront(l, run, runEnd)
	a.c.stored.Add(stored)
	a.evict(id, now)
	for a.st.n > a.cfg.MaxEntries {
		a.st.remove(a.st.oldest(src))
		a.c.evicted.Add(1)
	}
	a.publish()
}

// expiry returns the clock in nanoseconds and the expiry of a block routed
// now, or 0 and never (math.MaxUint64) without Config.ApproxTTL.
func (a *Approx) expiry() (now int64, exp uint64) {
	if a.cfg.ApproxTTL <= 0 {
		return 0, math.MaxUint64
	}
	now = a.cfg.Now().UnixNano()
	return now, uint64(now + int64(a.cfg.ApproxTTL))
}

// evict drops id's expired entries (now > 0) and its least recent ones
// beyond capacity. Caller holds a.mu.
func (a *Approx) evict(id ReplicaID, now int64) {
	src := a.srcOf[id] - 1
	n := int64(0)
	for {
		idx := a.st.oldest(src)
		if idx == 0 {
			break
		}
		if a.st.srcs[src].tab.n <= a.capOf[id] && (now == 0 || a.st.ent(idx).aux >= uint64(now)) {
			break
		}
		a.st.remove(idx)
		n++
	}
	if n > 0 {
		a.c.evicted.Add(n)
	}
}

func (a *Approx) publish() {
	a.c.entries.Store(int64(a.st.n))
	a.c.keys.Store(int64(a.st.keys.n))
	a.c.bytes.Store(a.st.bytes())
}

// Lookup fills out[r] with replica r's Match for keys and returns out resized
// to NumReplicas; entries past Config.ApproxTTL are ignored. It changes no
// recency and allocates only when out is too short.
func (a *Approx) Lookup(keys []Key, out []Match) []Match {
	a.mu.RLock()
	defer a.mu.RUnlock()
	out = resize(out, len(a.reps.names))
	if len(out) == 0 || len(keys) == 0 {
		return out
	}
	now, _ := a.expiry()
	// The replicas whose runs reach the current key, each with its entry
	// for the key before: while each holds the key in the entry after
	// that one in its list (where Routed leaves a prompt's keys), the
	// key's holders need not be looked up.
	var liveBuf [8]liveRun
	live := liveBuf[:0]
	for i := 0; i < len(keys); i++ {
		switch {
		case len(live) == 1: // one replica's run, the usual case: follow it
			if i = a.followOne(keys, i, out, &live[0], uint64(now)); i == len(keys) {
				return finish(out)
			}
		case len(live) > 1:
			if a.follow(keys[i], out, live, uint64(now)) {
				continue
			}
		}
		if live = walkLive(&a.st, keys[i], int32(i), out, uint64(now), live[:0]); len(live) == 0 {
			break
		}
	}
	return finish(out)
}

// followOne is follow for one replica's run, l, over keys from i on: it
// credits each key its list holds in the entry after the one before, and
// returns the index of the first it does not (len(keys) when none).
func (a *Approx) followOne(keys []Key, i int, out []Match, l *liveRun, expired uint64) int {
	m := &out[l.r]
	at := l.at
	for ; i < len(keys); i++ {
		next := a.st.lnk(at).next
		if next == 0 {
			break
		}
		e := a.st.ent(next)
		if e.key != keys[i] || expired != 0 && e.aux < expired {
			break
		}
		t := bestTier(&e.refs)
		if t == tierNone {
			break
		}
		m.add(t, 1) // its run reached key i: the visit that grows it
		m.last = t
		at = next
	}
	l.at = at
	return i
}

// liveRun is a replica whose run reaches the key Lookup is at, and its
// entry for the key before.
type liveRun struct {
	r  ReplicaID
	at uint32
}

// follow credits key k to the replicas of live when each of them holds k
// in the entry right after its entry for the key before, moving live on
// to those entries; it reports false, crediting nothing, when some does
// not. An entry in a replica's list is the replica's one entry for its
// key, so the credits are those walk gives: replicas not in live have
// runs that ended before k, which k cannot extend. Caller holds a.mu.
func (a *Approx) follow(k Key, out []Match, live []liveRun, expired uint64) bool {
	for _, l := range live {
		next := a.st.lnk(l.at).next
		if next == 0 {
			return false
		}
		if e := a.st.ent(next); e.key != k || expired != 0 && e.aux < expired || bestTier(&e.refs) == tierNone {
			return false
		}
	}
	for j := range live {
		l := &live[j]
		l.at = a.st.lnk(l.at).next
		t := bestTier(&a.st.ent(l.at).refs)
		m := &out[l.r]
		m.add(t, 1) // its run reached k: the visit that grows it
		m.last = t
	}
	return true
}

// walkLive is walk (tier GPU) returning, appended to live, the replicas
// whose runs grew and the entries they grew by.
func walkLive(st *store, k Key, i int32, out []Match, expired uint64, live []liveRun) []liveRun {
	for idx := st.head(k); idx != 0; {
		cur, e := idx, st.ent(idx)
		idx = e.next
		if expired != 0 && e.aux < expired {
			continue
		}
		r := st.srcs[e.src].replica
		if int(r) >= len(out) {
			continue
		}
		t := bestTier(&e.refs)
		if t == tierNone {
			continue
		}
		if out[r].visit(i, t) {
			live = append(live, liveRun{r, cur})
		}
	}
	return live
}

// Stats returns the index's counters; it takes no lock.
func (a *Approx) Stats() Stats { return a.c.stats() }

// ReplicaBlocks returns how many entries replica id holds (its "tree size").
func (a *Approx) ReplicaBlocks(id ReplicaID) int {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return a.st.replicaEntries(id)
}
