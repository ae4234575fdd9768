package routing

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zeebo/xxh3"

	"kvrouter/internal/kvindex"
)

// lookup is what a policy needs from an index: kvindex.Exact and
// kvindex.Approx both implement it.
type lookup interface {
	Lookup(keys []kvindex.Key, out []kvindex.Match) []kvindex.Match
}

// Index is what a Router needs from a kvindex.Exact or kvindex.Approx: the
// lookup, replica registration, and recording a decision (Exact: predicted
// blocks; Approx: the routed keys). If the index also has Root() kvindex.Key
// and BlockSize() int, the Router hashes with them.
type Index interface {
	lookup
	AddReplica(name string) kvindex.ReplicaID
	RemoveReplica(name string) bool
	Routed(id kvindex.ReplicaID, keys []kvindex.Key)
}

// keySpace is the optional part of an Index that fixes how keys are made.
type keySpace interface {
	Root() kvindex.Key
	BlockSize() int
}

// matchRouter is the optional part of an Index (kvindex.Exact) that records
// a decision knowing the chosen replica's Match from the Lookup just made,
// so that it need not walk the prompt's held prefix again, and names the
// blocks it predicted so that Lease.Failed can drop them.
type matchRouter interface {
	RoutedMatch(id kvindex.ReplicaID, keys []kvindex.Key, m kvindex.Match) kvindex.Prediction
	Cancel(p kvindex.Prediction) int
}

// sizer is the optional part of an Index that reports per-replica sizes.
type sizer interface {
	ReplicaBlocks(id kvindex.ReplicaID) int
}

// ErrNoReplica is returned by Route when no healthy, non-excluded replica is
// registered.
var ErrNoReplica = errors.New("routing: no replica available")

// Router routes requests among the replicas of one model and pool. See the
// package doc. Safe for concurrent use.
type Router struct {
	cfg    Config
	ix     Index
	root   kvindex.Key
	policy Policy
	log    *slog.Logger
	m      *metrics

	mu   sync.RWMutex
	reps map[string]*replica
	list []*replica // sorted by name: candidates in a stable order

	bufs sync.Pool // *scratch

	place atomic.Uint64 // (routers<<32 | index): SetStripes, stripes.go
}

type scratch struct {
	keys    []kvindex.Key
	matches []kvindex.Match
	cands   []Candidate
	reps    []*replica
}

// New returns a Router over ix (nil: no cache information, every Match is
// zero) with cfg's policy. Zero cfg fields take their defaults; log nil
// discards; reg nil exports no metrics (routingprom.Wrap adapts Prometheus). Errors from cfg are joined.
func New(cfg Config, ix Index, log *slog.Logger, reg Registerer) (*Router, error) {
	var root kvindex.Key
	if ks, ok := ix.(keySpace); ok && ix != nil {
		root = ks.Root()
		if cfg.BlockSize == 0 {
			cfg.BlockSize = ks.BlockSize()
		} else if cfg.BlockSize != ks.BlockSize() {
			return nil, fmt.Errorf("routing: block_size %d differs from the index's %d", cfg.BlockSize, ks.BlockSize())
		}
	}
	cfg = DefaultConfig(cfg)
	errs := []error{cfg.validate()}
	p, err := NewPolicy(cfg.Policy, cfg)
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("routing: %w", err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &Router{cfg: cfg, ix: ix, root: root, policy: p, log: log.With("policy", cfg.Policy), reps: make(map[string]*replica)}
	r.bufs.New = func() any { return new(scratch) }
	r.place.Store(packPlace(cfg.Routers, cfg.RouterIndex))
	m, err := newMetrics(reg, cfg.Policy, r.Stats)
	if err != nil {
		return nil, err
	}
	r.m = m
	return r, nil
}

// Policy returns the router's policy.
func (r *Router) Policy() Policy { return r.policy }

// AddReplica registers name (idempotent), healthy, with the configured
// rates.
func (r *Router) AddReplica(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.reps[name]; ok {
		return
	}
	rep := &replica{name: name}
	if r.ix != nil {
		rep.id = r.ix.AddReplica(name)
	}
	rep.healthy.Store(true)
	rep.prefillRate.Store(math.Float64bits(r.cfg.PrefillRate))
	rep.decodeRate.Store(math.Float64bits(r.cfg.DecodeRate))
	r.reps[name] = rep
	r.list = append(r.list, rep)
	slices.SortFunc(r.list, func(a, b *replica) int { return cmp.Compare(a.name, b.name) })
}

// RemoveReplica forgets name and its index entries. Leases still held on it
// release harmlessly.
func (r *Router) RemoveReplica(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rep, ok := r.reps[name]
	if !ok {
		return
	}
	rep.gone.Store(true)
	delete(r.reps, name)
	r.list = slices.DeleteFunc(r.list, func(x *replica) bool { return x == rep })
	if r.ix != nil {
		r.ix.RemoveReplica(name)
	}
}

// SetHealthy marks name eligible (true) or not; unknown names are ignored.
func (r *Router) SetHealthy(name string, ok bool) {
	if rep := r.get(name); rep != nil {
		rep.healthy.Store(ok)
	}
}

// SetIndexTrusted sets whether policies see what the index holds for name
// (default true). A distrusted replica's candidates carry no Match, so it
// competes by load alone, while Decision.IndexBlocks still reports what the
// index holds there (to tell when index and engine agree again). Unknown
// names are ignored.
func (r *Router) SetIndexTrusted(name string, ok bool) {
	if rep := r.get(name); rep != nil {
		rep.distrusted.Store(!ok)
	}
}

// heldBlocks is m's leading run less its predicted blocks: what the index
// says the engine holds (GPU, CPU or storage).
func heldBlocks(m kvindex.Match) int { return m.Blocks() - int(m.Predicted) }

// SetRates sets name's prefill and decode throughput in tokens/s (values
// <= 0 keep the current ones).
func (r *Router) SetRates(name string, prefill, decode float64) {
	rep := r.get(name)
	if rep == nil {
		return
	}
	if prefill > 0 {
		rep.prefillRate.Store(math.Float64bits(prefill))
	}
	if decode > 0 {
		rep.decodeRate.Store(math.Float64bits(decode))
	}
}

// SetCapacity sets name's KV cache size in blocks (vLLM's num_gpu_blocks,
// per data-parallel rank) for kv's cache pressure; blocks <= 0 means
// unknown (no pressure term). Unknown names are ignored.
func (r *Router) SetCapacity(name string, blocks int) {
	if rep := r.get(name); rep != nil {
		rep.capacity.Store(int64(max(blocks, 0)))
	}
}

// ObserveGauges records name's scraped engine gauges; they count for
// Config.GaugeMaxAge after g.At.
func (r *Router) ObserveGauges(name string, g Gauges) {
	if rep := r.get(name); rep != nil {
		rep.gauges.Store(&g)
	}
}

// Load returns name's current load, false when unknown.
func (r *Router) Load(name string) (Load, bool) {
	rep := r.get(name)
	if rep == nil {
		return Load{}, false
	}
	return rep.load(r.cfg.Now(), r.cfg.GaugeMaxAge), true
}

func (r *Router) get(name string) *replica {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.reps[name]
}

// Route chooses a replica for req and charges it: the returned Lease holds
// the request's load until Release, and the index records the decision. It
// returns ErrNoReplica when no healthy replica outside req.Exclude is
// registered. Route sets req.Extras.Root; when req.Keys is nil and the
// router has an index it hashes req.Tokens into a pooled buffer (req.Keys
// stays nil). Route does not retain req.
func (r *Router) Route(req *Request) (Decision, *Lease, error) {
	start := time.Now()
	s := r.bufs.Get().(*scratch)
	defer r.bufs.Put(s)

	cands, reps, keys := r.candidates(req, s)
	if len(cands) == 0 {
		r.m.noReplica.Add(1)
		return Decision{Policy: r.cfg.Policy, Index: -1}, nil, ErrNoReplica
	}
	d := r.policy.Pick(req, cands)
	if d.Index < 0 || d.Index >= len(cands) {
		return d, nil, fmt.Errorf("routing: policy %s chose no candidate", r.cfg.Policy)
	}
	rep := reps[d.Index]
	if int(rep.id) < len(s.matches) {
		d.IndexBlocks = heldBlocks(s.matches[rep.id])
	}
	var mr matchRouter
	var pred kvindex.Prediction
	if r.ix != nil && len(keys) > 0 {
		var ok bool
		if mr, ok = r.ix.(matchRouter); ok && int(rep.id) < len(s.matches) {
			pred = mr.RoutedMatch(rep.id, keys, s.matches[rep.id])
		} else {
			r.ix.Routed(rep.id, keys)
		}
	}
	t := d.Chosen()
	prompt := int64(req.promptTokens())
	prefill := prompt - int64(min(float64(prompt), float64(t.CachedBlocks*r.cfg.BlockSize)))
	if t.NewTokens > 0 || t.Credit > 0 {
		prefill = int64(math.Ceil(t.NewTokens))
	}
	out := int64(req.MaxTokens)
	if out <= 0 {
		out = int64(r.cfg.DefaultMaxTokens)
	}
	lease := newLease(rep, r.m, prefill, out, prompt+out)
	lease.decision = d
	if pred != (kvindex.Prediction{}) {
		lease.cancel, lease.pred = mr, pred
	}
	rep.decisions.Add(1)
	r.m.observe(t, prompt, r.cfg.BlockSize, time.Since(start))
	if r.log.Enabled(context.Background(), slog.LevelDebug) {
		r.log.Debug("routed", "request_id", req.ID, "replica", rep.name, "reason", d.Reason,
			"cached_blocks", t.CachedBlocks, "cost", t.Cost, "prompt_tokens", prompt)
	}
	return d, lease, nil
}

// Evaluate returns the Decision policy p (nil: the router's own policy)
// makes for req over the router's current state, without recording
// anything: no Lease, no load, no prediction or approximate insert in the
// index, no metrics, and no policy state (EvaluatePolicy: no round-robin
// step, no trie insert, no random draw: a random tie-break becomes a
// deterministic one, see Evaluator). The candidates, block keys, index
// Lookup, loads and cost terms are exactly those Route uses, so for a
// policy without randomness (or without ties) Evaluate followed by Route,
// with no other Route or index change in between, chooses the same replica.
// It is what an explain endpoint or a shadow policy needs: p may be any
// Policy, e.g. one made by NewPolicy. Like Route it sets req.Extras.Root
// and does not retain req. It returns ErrNoReplica (with Index -1) when no
// healthy replica outside req.Exclude is registered.
func (r *Router) Evaluate(req *Request, p Policy) (Decision, error) {
	if p == nil {
		p = r.policy
	}
	s := r.bufs.Get().(*scratch)
	defer r.bufs.Put(s)
	cands, reps, _ := r.candidates(req, s)
	if len(cands) == 0 {
		return Decision{Policy: r.cfg.Policy, Index: -1}, ErrNoReplica
	}
	d := EvaluatePolicy(p, req, cands)
	if d.Index < 0 || d.Index >= len(cands) {
		return d, fmt.Errorf("routing: policy %s chose no candidate", d.Policy)
	}
	if id := reps[d.Index].id; int(id) < len(s.matches) {
		d.IndexBlocks = heldBlocks(s.matches[id])
	}
	return d, nil
}

// NewPolicy returns a new policy called name configured as the router's
// (weights, rates, block size learned from the index), for Evaluate: a
// shadow policy whose choices are computed but not followed. Its random
// source is its own, seeded from name, so it never shares the router's.
func (r *Router) NewPolicy(name string) (Policy, error) {
	cfg := r.cfg
	seed := xxh3.HashString(name)
	cfg.Rand = rand.New(rand.NewPCG(seed, seed>>1|1))
	p, err := NewPolicy(name, cfg)
	if err != nil {
		return nil, fmt.Errorf("routing: %w", err)
	}
	return p, nil
}

// candidates fills s with req's candidates (healthy replicas outside
// req.Exclude, in name order, each with its Load, its Match for the
// prompt's keys and its Held blocks) and returns them, their replicas and
// the keys. It records nothing.
func (r *Router) candidates(req *Request, s *scratch) ([]Candidate, []*replica, []kvindex.Key) {
	now := r.cfg.Now()
	routers, index := r.Stripes() // once: every candidate dealt under one place
	r.mu.RLock()
	cands := s.cands[:0]
	reps := s.reps[:0]
	for pos, rep := range r.list {
		if !rep.healthy.Load() || slices.Contains(req.Exclude, rep.name) {
			continue
		}
		reps = append(reps, rep)
		cands = append(cands, Candidate{Name: rep.name, ID: rep.id, Held: -1, Capacity: int(rep.capacity.Load()),
			Load: rep.load(now, r.cfg.GaugeMaxAge), Stripe: stripeRank(pos, routers, index)})
	}
	r.mu.RUnlock()
	s.cands, s.reps = cands, reps
	if len(cands) == 0 {
		return nil, nil, nil
	}

	keys := req.Keys
	if keys == nil {
		req.Extras.Root = r.root
		if r.ix != nil { // only the index reads keys
			s.keys = promptKeys(s.keys, req, r.cfg.BlockSize)
			keys = s.keys
		}
	}
	s.matches = s.matches[:0]
	if r.ix != nil && len(keys) > 0 {
		s.matches = r.ix.Lookup(keys, s.matches)
		for i := range cands {
			if int(cands[i].ID) < len(s.matches) && !reps[i].distrusted.Load() {
				cands[i].Match = s.matches[cands[i].ID]
			}
		}
	}
	if sz, ok := r.ix.(sizer); ok && r.ix != nil {
		for i := range cands {
			cands[i].Held = sz.ReplicaBlocks(cands[i].ID)
		}
	}
	return cands, reps, keys
}

// Stats returns the router's counters and each replica's load; it takes only
// the replica set's read lock.
func (r *Router) Stats() Stats {
	s := r.m.stats()
	now := r.cfg.Now()
	r.mu.RLock()
	defer r.mu.RUnlock()
	for _, rep := range r.list {
		s.Replicas = append(s.Replicas, ReplicaStats{Name: rep.name, Decisions: rep.decisions.Load(), Load: rep.load(now, r.cfg.GaugeMaxAge)})
	}
	return s
}
