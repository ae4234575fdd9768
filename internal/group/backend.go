package group

import (
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"kvrouter/internal/config"
	"kvrouter/internal/kvindex"
	"kvrouter/internal/routing"
	"kvrouter/internal/vllm"
)

// BackendConfig configures a Backend: one model group's routing.
type BackendConfig struct {
	// Model is the model name (the index's key space).
	Model string
	// Replicas are the engine names, as in the fleet.
	Replicas []string
	// Exact selects the event-fed index (some engine publishes KV events);
	// otherwise the approximate index learns from routing decisions.
	Exact bool
	// Policy is the routing policy name, or config.PolicyShadow.
	Policy string
	// ShadowServe is the serving policy in shadow mode (default round_robin).
	ShadowServe string
	// Routing configures the router and its policies (Policy is overridden).
	Routing routing.Config
	// Index configures the index (Model and BlockSize are overridden).
	Index kvindex.Config
	// DPSize is each engine's configured number of data-parallel ranks (at
	// least the engine labels its /metrics report count for sizing the
	// index; absent: 1).
	DPSize map[string]int
}

// PolicyShadow is the policy name of shadow mode: the group routes with
// BackendConfig.ShadowServe and computes, without following, what kv would
// choose (Decision.Shadow).
const PolicyShadow = "shadow"

// Backend is one model group's routing state: a kvindex over its engines,
// a routing.Router over that index, and in shadow mode the kv policy whose
// choices are computed and exported but not followed. It implements Router.
//
// The engines' block size is learned, from vllm:cache_config_info (Observe)
// or from BlockStored events (Apply); until then it is the index default
// (16). A different size rebuilds index and router (an index keyed with the
// wrong block size never matches), losing what the old index held, unless
// another engine of the group still reports the current size: engines that
// disagree are warned about, not rebuilt for on every report. Safe for
// concurrent use.
type Backend struct {
	cfg      BackendConfig
	log      *slog.Logger
	ixReg    kvindex.Registerer
	rtReg    routing.Registerer
	mu       sync.Mutex // serializes rebuilds
	cur      atomic.Pointer[generation]
	rebuilds atomic.Int64

	// reports is what each engine last reported (under repMu): its block
	// size and its GPU blocks over its DP ranks. An engine that stops
	// reporting keeps its entry (and its say in setBlockSize).
	repMu   sync.Mutex
	reports map[string]engineReport
	dp      map[string]int // each engine's configured DP ranks (under repMu)
	// pending are the engines' parts of a snapshot not yet in the index
	// (under repMu; snapshot.go).
	pending map[string]*kvindex.Snapshot

	// distrusted are the engines whose index entries the policy ignores
	// (SetIndexTrusted; under repMu), applied to every rebuilt generation.
	distrusted map[string]bool

	// replicas are the group's engine names, replaced whole by AddReplica
	// and RemoveReplica (under mu, so a rebuild sees a consistent list).
	replicas atomic.Pointer[[]string]
}

// engineReport is what one engine last reported (0: not yet).
type engineReport struct{ blockSize, blocks int }

// generation is an index and router built for one block size.
type generation struct {
	blockSize int
	root      kvindex.Key
	exact     *kvindex.Exact
	approx    *kvindex.Approx
	router    *routing.Router
	serving   string         // policy name that routes
	shadow    routing.Policy // kv, in shadow mode (router.Evaluate'd); nil otherwise
	reserved  atomic.Int64   // entries exact was sized for from the engines' capacity
}

// NewBackend builds a Backend. ixReg and rtReg export the index's and the
// router's statistics (kvindexprom.Wrap, routingprom.Wrap; nil: none); they
// are registered once and follow rebuilds.
func NewBackend(cfg BackendConfig, log *slog.Logger, ixReg kvindex.Registerer, rtReg routing.Registerer) (*Backend, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.Policy == "" {
		cfg.Policy = "kv"
	}
	if cfg.ShadowServe == "" {
		cfg.ShadowServe = "round_robin"
	}
	b := &Backend{cfg: cfg, log: log.With("model", cfg.Model), reports: map[string]engineReport{}, dp: map[string]int{}}
	names := slices.Clone(cfg.Replicas)
	b.replicas.Store(&names)
	for n, d := range cfg.DPSize {
		b.dp[n] = d
	}
	if ixReg != nil {
		b.ixReg = &onceIndexReg{reg: ixReg, stats: b.IndexStats}
	}
	if rtReg != nil {
		b.rtReg = &onceRouterReg{reg: rtReg, stats: b.routerStats}
	}
	g, err := b.build(cfg.Index.BlockSize)
	if err != nil {
		return nil, err
	}
	b.cur.Store(g)
	return b, nil
}

func (b *Backend) build(blockSize int) (*generation, error) {
	icfg := b.cfg.Index
	icfg.Model, icfg.BlockSize = b.cfg.Model, blockSize
	g := &generation{}
	var ix routing.Index
	if b.cfg.Exact {
		x, err := kvindex.NewExact(icfg, b.log, b.ixReg)
		if err != nil {
			return nil, err
		}
		g.exact, ix, g.root, g.blockSize = x, x, x.Root(), x.BlockSize()
	} else {
		a, err := kvindex.NewApprox(icfg, b.log, b.ixReg)
		if err != nil {
			return nil, err
		}
		g.approx, ix, g.root, g.blockSize = a, a, a.Root(), a.BlockSize()
	}
	rcfg := b.cfg.Routing
	rcfg.BlockSize = 0 // from the index
	rcfg.Policy = b.cfg.Policy
	if rcfg.Policy == config.PolicyShadow {
		rcfg.Policy = b.cfg.ShadowServe
	}
	g.serving = rcfg.Policy
	r, err := routing.New(rcfg, ix, b.log, b.rtReg)
	if err != nil {
		return nil, err
	}
	if b.cfg.Policy == config.PolicyShadow {
		// Made by the router: same weights and the index's block size.
		if g.shadow, err = r.NewPolicy("kv"); err != nil {
			return nil, err
		}
	}
	g.router = r
	b.repMu.Lock()
	distrusted := maps.Clone(b.distrusted)
	b.repMu.Unlock()
	for _, name := range *b.replicas.Load() {
		for _, rn := range b.replicaNames(name) {
			r.AddReplica(rn)
			if distrusted[name] {
				r.SetIndexTrusted(rn, false)
			}
		}
	}
	b.capacities(g)
	return g, nil
}

// BlockSize returns the block size in tokens currently keyed with.
func (b *Backend) BlockSize() int { return b.cur.Load().blockSize }

// setBlockSize records engine's block size n and rebuilds index and router
// when n differs from the current block size, unless another engine reports
// the current one: engines of one model group disagreeing on the block size
// is a misconfiguration (the minority's blocks never match), warned once per
// engine and size instead of rebuilding, and emptying the index, on every
// report.
func (b *Backend) setBlockSize(engine string, n int, source string) {
	if n <= 0 {
		return
	}
	b.repMu.Lock()
	r := b.reports[engine]
	prev := r.blockSize
	r.blockSize = n
	b.reports[engine] = r
	cur := b.cur.Load().blockSize
	agrees := ""
	for other, o := range b.reports {
		if other != engine && o.blockSize == cur {
			agrees = other
			break
		}
	}
	b.repMu.Unlock()
	switch {
	case n == cur:
		return
	case agrees != "":
		if prev != n {
			b.log.Warn("engines disagree on the block size; keeping the index's (give the model group one block size: the other engine's blocks never match)",
				"block_size", cur, "engine", engine, "engine_block_size", n, "agrees", agrees)
		}
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	old := b.cur.Load()
	if old.blockSize == n {
		return
	}
	g, err := b.build(n)
	if err != nil {
		b.log.Error("rebuilding index for a new block size", "block_size", n, "err", err)
		return
	}
	b.cur.Store(g)
	b.rebuilds.Add(1)
	b.log.Info("block size learned, index rebuilt", "block_size", n, "was", old.blockSize, "source", source, "engine", engine)
}

// EngineMetrics is one scrape of an engine's GET /metrics as a Backend
// reads it; internal/vllm/enginemetrics.Metrics implements it (the group
// does not parse the exposition itself, so it stays free of the Prometheus
// text parser and net/http).
type EngineMetrics interface {
	// CacheConfig returns vllm:cache_config_info's block size (tokens) and
	// number of GPU blocks per engine core, and the number of engine cores
	// (data-parallel ranks) reporting; 0 when absent.
	CacheConfig() (blockSize, gpuBlocks, engines int)
	// Load returns the requests running and waiting, summed over ranks,
	// and the KV cache usage (fraction 0..1, averaged over ranks).
	Load() (running, waiting, kvUsage float64)
	// RankLoad is Load of one data-parallel rank (the series labelled
	// engine="rank"); ok is false when the engine exported none.
	RankLoad(rank int) (running, waiting, kvUsage float64, ok bool)
	// RateCounters returns the cumulative prefill and decode counters
	// (tokens, seconds); ok is false when any is missing.
	RateCounters() (prefillTokens, prefillSeconds, decodeTokens, decodeSeconds float64, ok bool)
}

// Observe takes one engine's scraped /metrics: load gauges for the router,
// the block size and the number of GPU blocks over the engine's DP ranks
// (the approximate index's capacity for the engine; the exact index's key
// table is sized for the engines' sum). at is when the scrape was taken.
func (b *Backend) Observe(engine string, m EngineMetrics, at time.Time) {
	if !b.has(engine) {
		return // removed while its scrape was under way
	}
	blockSize, gpuBlocks, engines := m.CacheConfig()
	blocks := 0
	if gpuBlocks > 0 {
		b.repMu.Lock() // before a rebuild for a new block size reads it
		blocks = gpuBlocks * max(engines, b.dp[engine], 1)
		r := b.reports[engine]
		r.blocks = blocks
		b.reports[engine] = r
		b.repMu.Unlock()
	}
	b.setBlockSize(engine, blockSize, "metrics")
	g := b.cur.Load()
	running, waiting, kvUsage := m.Load()
	b.observeRanks(g, engine, m, routing.Gauges{Waiting: int(waiting), Running: int(running), KVUsage: kvUsage, At: at})
	if pt, ps, dt, ds, ok := m.RateCounters(); ok {
		b.observeRates(g, engine, routing.RateSample{At: at, PrefillTokens: pt, PrefillSeconds: ps, DecodeTokens: dt, DecodeSeconds: ds})
	}
	if blocks == 0 {
		return
	}
	b.setCapacity(g, engine, blocks)
	if g.exact != nil && b.cfg.Index.ExpectedEntries == 0 {
		b.sizeIndex(g)
	}
}

// capacities sets, in the new generation g, the capacity of every engine
// whose last report had g's block size, so that a rebuild does not fall
// back to the default capacity (approximate index) or to none (kv's cache
// pressure) until each engine's next scrape.
func (b *Backend) capacities(g *generation) {
	blockSize := g.blockSize
	b.repMu.Lock()
	caps := map[string]int{}
	for engine, r := range b.reports {
		if r.blocks > 0 && r.blockSize == blockSize {
			caps[engine] = r.blocks
		}
	}
	b.repMu.Unlock()
	for engine, blocks := range caps {
		b.setCapacity(g, engine, blocks)
	}
}

// sizeIndex reserves entries in g's exact index (kvindex.Exact.Reserve)
// when the engines' reported capacities outgrow what it was sized for, so
// that the index does not rehash while filling. Configured
// index.expected_entries disables it.
func (b *Backend) sizeIndex(g *generation) {
	b.repMu.Lock()
	total, engines := 0, 0
	for _, r := range b.reports {
		if r.blocks > 0 {
			total += r.blocks
			engines++
		}
	}
	grow := int64(total) > g.reserved.Load()
	if grow {
		g.reserved.Store(int64(total)) // under repMu: only ever raised
	}
	b.repMu.Unlock()
	if !grow {
		return
	}
	g.exact.Reserve(total)
	b.log.Info("index sized for the engines' KV cache", "entries", total, "engines", engines)
}

// Apply takes one KV event update of engine (from its kvevents.Subscriber):
// a reset drops the engine rank's entries first; a BlockStored with a new
// block size rebuilds the index.
func (b *Backend) Apply(u vllm.Update) {
	if !b.has(u.Engine) {
		return // a late update of an engine already removed: never re-add it
	}
	for i := range u.Batch.Events {
		if ev := &u.Batch.Events[i]; ev.Type == vllm.BlockStored && ev.IsFullAttention() && ev.BlockSize > 0 {
			b.setBlockSize(u.Engine, ev.BlockSize, "events")
			break
		}
	}
	g := b.cur.Load()
	if g.exact == nil {
		return
	}
	name := b.eventReplica(u.Engine, u.Rank)
	var at *kvindex.Mark
	if !u.NoBatch {
		at = &kvindex.Mark{Seq: u.Seq, Sum: u.Sum}
	}
	g.exact.ApplyMarked(name, u.Rank, u.Reset != vllm.ResetNone, &u.Batch, at)
}

// Exact reports whether the model routes with the event-fed index
// (kvindex.Exact) rather than the approximate one; GET /ready shows it.
func (b *Backend) Exact() bool { return b.cur.Load().exact != nil }

// UsesText reports whether the serving policy routes by prompt text
// (prefix_chars): only then does the caller build RouteInput.Text, which
// costs a decode of every chat message.
func (b *Backend) UsesText() bool { return b.cur.Load().serving == "prefix_chars" }

// Route implements Router.
func (b *Backend) Route(in *RouteInput) (Decision, error) {
	g := b.cur.Load()
	req := &routing.Request{
		ID:         in.RequestID,
		Tokens:     in.Tokens,
		Text:       in.Text,
		SessionKey: in.Session,
		MaxTokens:  in.MaxTokens,
		Extras:     kvindex.Extras{CacheSalt: in.CacheSalt, LoRA: in.LoRA, MM: in.MM},
		KeyMemo:    in.KeyMemo,
	}
	req.PromptTokens = in.PromptTokens // media prompts routed by load
	for _, name := range *b.replicas.Load() {
		if !slices.Contains(in.Candidates, name) {
			req.Exclude = append(req.Exclude, b.replicaNames(name)...)
		}
	}
	if in.DryRun {
		d, err := g.router.Evaluate(req, nil)
		out := Decision{Replica: d.Name, Policy: d.Policy, CachedTokens: cachedTokens(d, g.blockSize, len(in.Tokens)), Explain: explanation(d, g, len(in.Tokens))}
		if g.shadow != nil {
			out.Shadow = b.shadowDecision(g, req, len(in.Tokens))
		}
		b.setRank(&out)
		if err != nil {
			return out, fmt.Errorf("model %q: %w", b.cfg.Model, err)
		}
		return out, nil
	}
	var shadow *ShadowDecision
	if g.shadow != nil { // before Route records the serving decision
		shadow = b.shadowDecision(g, req, len(in.Tokens))
	}
	d, lease, err := g.router.Route(req)
	if err != nil {
		return Decision{}, fmt.Errorf("model %q: %w", b.cfg.Model, err)
	}
	out := Decision{
		Replica:           d.Name,
		Policy:            d.Policy,
		CachedTokens:      cachedTokens(d, g.blockSize, len(in.Tokens)),
		IndexCachedTokens: engineHit(d.IndexBlocks, g.blockSize, len(in.Tokens)),
		Release:           lease.Release,
		Failed:            lease.Failed,
		FirstToken:        lease.FirstToken,
		PredictedTTFT:     lease.PredictedTTFT(),
		Shadow:            shadow,
		Explain:           explanation(d, g, len(in.Tokens)),
	}
	b.setRank(&out)
	return out, nil
}

// SetIndexTrusted implements IndexTruster: whether the policy sees the
// index's entries of engine (all its data-parallel ranks) in this
// generation of the group (routing.Router.SetIndexTrusted).
func (b *Backend) SetIndexTrusted(engine string, ok bool) {
	b.mu.Lock() // no rebuild in between: the new generation sees the set
	defer b.mu.Unlock()
	b.repMu.Lock()
	if b.distrusted == nil {
		b.distrusted = map[string]bool{}
	}
	if ok {
		delete(b.distrusted, engine)
	} else {
		b.distrusted[engine] = true
	}
	b.repMu.Unlock()
	g := b.cur.Load()
	for _, name := range b.replicaNames(engine) {
		g.router.SetIndexTrusted(name, ok)
	}
}

// shadowDecision is what the shadow kv policy would choose for req now, by
// routing.Router.Evaluate (same keys, lookup and loads as Route; nothing
// recorded).
func (b *Backend) shadowDecision(g *generation, req *routing.Request, prompt int) *ShadowDecision {
	sd, _ := g.router.Evaluate(req, g.shadow) // no replica: Name "", 0 cached
	return &ShadowDecision{Replica: sd.Name, CachedTokens: cachedTokens(sd, g.blockSize, prompt)}
}

func cachedTokens(d routing.Decision, blockSize, prompt int) int {
	return engineHit(d.Chosen().CachedBlocks, blockSize, prompt)
}

// engineHit is the prefix-cache hit in tokens an engine holding the
// prompt's first blocks reports: whole blocks, at most prompt-1 tokens (vLLM
// computes at least the prompt's last token, so a fully cached prompt hits
// one block less: KVCacheManager.get_computed_blocks). prompt 0: unknown,
// no cap.
func engineHit(blocks, blockSize, prompt int) int {
	n := blocks * blockSize
	if prompt > 0 && blockSize > 0 {
		n = min(n, (prompt-1)/blockSize*blockSize)
	}
	return n
}

// costUnits names the unit of each policy's cost (routing's Pick docs);
// round_robin and random have no cost, so their candidates carry none.
var costUnits = map[string]string{
	"kv":           "seconds",
	"dynamo":       "blocks",
	"least_load":   "requests",
	"llmd":         "negated_score",
	"prefix_chars": "negated_matched_chars",
	"session":      "negated_rendezvous_weight",
	"sglang":       "branch_rank",
}

// explanation is the JSON record of a decision for POST /v1/route. The
// token terms mean the same under every policy: cached_tokens is the
// candidate's indexed prefix (cached_blocks * block_size, at most the
// prompt) and new_tokens the prompt tokens left to prefill there
// (prompt - cached_tokens); credited_tokens is the part the policy
// counted as cached after its tier weights and decay (kv, dynamo only).
// cost and cost_unit are present only for policies that compute a cost.
func explanation(d routing.Decision, g *generation, prompt int) any {
	type term struct {
		Replica        string   `json:"replica"`
		CachedBlocks   int      `json:"cached_blocks"`
		CachedTokens   int      `json:"cached_tokens"`
		NewTokens      int      `json:"new_tokens"`
		CreditedTokens *float64 `json:"credited_tokens,omitempty"`
		Cost           *float64 `json:"cost,omitempty"`
	}
	unit := costUnits[d.Policy]
	out := struct {
		Policy     string `json:"policy"`
		Reason     string `json:"reason"`
		BlockSize  int    `json:"block_size"`
		CostUnit   string `json:"cost_unit,omitempty"`
		Candidates []term `json:"candidates"`
	}{d.Policy, d.Reason, g.blockSize, unit, make([]term, 0, len(d.Terms))}
	credits := d.Policy == "kv" || d.Policy == "dynamo"
	for _, t := range d.Terms {
		cached := engineHit(t.CachedBlocks, g.blockSize, prompt)
		tm := term{Replica: t.Name, CachedBlocks: t.CachedBlocks, CachedTokens: cached, NewTokens: max(prompt-cached, 0)}
		if credits {
			tm.CreditedTokens = &t.Credit
		}
		if unit != "" {
			tm.Cost = &t.Cost
		}
		out.Candidates = append(out.Candidates, tm)
	}
	return out
}

// IndexStats returns the statistics of the group's current index (exact
// or approximate; kvindex.Stats), the figures its Registerer exports.
func (b *Backend) IndexStats() kvindex.Stats {
	g := b.cur.Load()
	if g == nil {
		return kvindex.Stats{}
	}
	if g.exact != nil {
		return g.exact.Stats()
	}
	return g.approx.Stats()
}

func (b *Backend) routerStats() routing.Stats {
	g := b.cur.Load()
	if g == nil {
		return routing.Stats{}
	}
	return g.router.Stats()
}

// onceIndexReg registers the first index's collector, reading whatever
// index is current, and ignores later registrations (rebuilds).
type onceIndexReg struct {
	once  sync.Once
	reg   kvindex.Registerer
	stats func() kvindex.Stats
}

func (o *onceIndexReg) RegisterIndex(kind string, cfg kvindex.Config, _ func() kvindex.Stats) error {
	var err error
	o.once.Do(func() { err = o.reg.RegisterIndex(kind, cfg, o.stats) })
	return err
}

// onceRouterReg is onceIndexReg for the router.
type onceRouterReg struct {
	once  sync.Once
	reg   routing.Registerer
	stats func() routing.Stats
}

func (o *onceRouterReg) RegisterRouter(policy string, _ func() routing.Stats) error {
	var err error
	o.once.Do(func() { err = o.reg.RegisterRouter(policy, o.stats) })
	return err
}

// has reports whether name is one of the group's engines.
func (b *Backend) has(name string) bool { return slices.Contains(*b.replicas.Load(), name) }

// AddReplica adds engine name with dpSize data-parallel ranks to the group
// while it serves (idempotent). It starts cold: no index entries, so it
// warms through the cost function like any new replica.
func (b *Backend) AddReplica(name string, dpSize int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	cur := *b.replicas.Load()
	if slices.Contains(cur, name) {
		return
	}
	next := append(slices.Clone(cur), name)
	b.repMu.Lock()
	b.dp[name] = dpSize
	b.repMu.Unlock()
	b.replicas.Store(&next)
	for _, rn := range b.replicaNames(name) {
		b.cur.Load().router.AddReplica(rn)
	}
}

// RemoveReplica removes engine name from the group: its index entries,
// predictions, load and reports go; leases of requests still in flight on
// it release harmlessly. Stop its KV event subscriber first: Apply ignores
// updates of engines not in the group.
func (b *Backend) RemoveReplica(name string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	cur := *b.replicas.Load()
	if !slices.Contains(cur, name) {
		return
	}
	next := slices.DeleteFunc(slices.Clone(cur), func(n string) bool { return n == name })
	names := b.replicaNames(name)
	b.replicas.Store(&next)
	b.repMu.Lock()
	delete(b.reports, name)
	delete(b.dp, name)
	delete(b.distrusted, name)
	b.repMu.Unlock()
	for _, rn := range names {
		b.cur.Load().router.RemoveReplica(rn)
	}
}

// DPSize returns engine name's configured data-parallel ranks (1 when
// unknown or unset).
func (b *Backend) DPSize(name string) int {
	b.repMu.Lock()
	defer b.repMu.Unlock()
	return max(b.dp[name], 1)
}
