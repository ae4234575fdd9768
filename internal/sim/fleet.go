package sim

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"kvrouter/internal/bench/report"
	"kvrouter/internal/enginesim"
	"kvrouter/internal/kvindex"
	"kvrouter/internal/routing"
	"kvrouter/internal/vllm"
	"kvrouter/internal/workload"
)

// epoch is the wall-clock reading of virtual time zero, handed to the index
// and router (any fixed instant would do).
var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// replica is one simulated engine.
type replica struct {
	name     string
	core     *enginesim.Core
	stepping bool // a step is under way (its end is queued)
	kicked   bool // a kick is queued
	removed  bool // no longer routable; drains
	res      enginesim.StepResult
	load     int // in-flight requests (cache_greedy's load; also the plot)
	// route is the router's name for it (name, or with Config.DPRankBlind
	// its engine's); rank is its data-parallel rank (dp.go).
	route string
	rank  int
}

// inflight is a request inside the fleet.
type inflight struct {
	sample             int
	rep                int
	lease              *routing.Lease // nil under cache_greedy
	last               time.Duration  // time of the latest token
	prefillLeg, remote bool           // P/D legs (pdsim.go)
}

// fleet is one policy's simulation. Owned by one goroutine.
type fleet struct {
	cfg    Config
	policy string
	w      *workload.Workload
	now    time.Duration
	q      queue
	reps   []*replica
	byName map[string]int
	router *routing.Router // nil under cache_greedy
	ix     *kvindex.Exact  // nil for cache-blind policies and cache_greedy
	// peers are the router replicas after the first (Config.Routers,
	// routers.go), built from ixCfg and rCfg; frontNext and frontRng
	// are the front balancer's.
	peers     []peer
	ixCfg     kvindex.Config
	rCfg      routing.Config
	frontNext int
	frontRng  *rand.Rand
	rng       *rand.Rand // event loss
	live      map[string]*inflight
	run       *report.Run

	batches []vllm.Batch // in transit, by slot
	free    []int        // free slots of batches
	toks    []uint32
	hashes  []vllm.BlockHash // cache_greedy's prompt block hashes
	text    []byte

	// ixAt is the index's clock (virtual time): the fleet sets it to now
	// before it calls into the index, the pipeline's applier to each
	// batch's apply time.
	ixAt time.Duration
	pipe *pipeline // nil: apply on this goroutine
	// coreFree reports whether a core is free for a pipeline now (under
	// PipelineAuto); nil means never.
	coreFree func() bool
	pd       *pdState // P/D arrangements (pdsim.go); nil: aggregated
	// rec, when not nil, records every routing decision (attribute.go).
	rec []decisionRec
	// lb is each engine's data-parallel balancer (dp.go), by the index of
	// its rank 0 in reps; nil without ranks or when the router sees them.
	lb map[int]*dpBalancer
}

func (f *fleet) clock() time.Time { return epoch.Add(f.now) }

// indexClock is the index's Now.
func (f *fleet) indexClock() time.Time { return epoch.Add(f.ixAt) }

// newFleet builds the cold fleet for one policy.
func newFleet(cfg Config, policy string, w *workload.Workload, seed uint64) (*fleet, error) {
	f := &fleet{
		cfg: cfg, policy: policy, w: w,
		byName: map[string]int{},
		rng:    rand.New(rand.NewPCG(seed, 0x1055)),
		live:   make(map[string]*inflight, 1024),
		run:    &report.Run{Policy: policy, Samples: make([]report.Sample, len(w.Requests))},
	}
	f.run.EngineHitRate = nan()
	if !cacheBlind(policy) && !isCacheGreedy(policy) {
		icfg := cfg.Index
		icfg.Now = f.indexClock
		icfg.BlockSize = f.blockSize()
		if icfg.ExpectedEntries == 0 {
			n, err := f.expectedEntries()
			if err != nil {
				return nil, err
			}
			icfg.ExpectedEntries = min(n, cmp.Or(icfg.MaxEntries, kvindex.DefaultMaxEntries))
		}
		ix, err := kvindex.NewExact(icfg, nil, nil)
		if err != nil {
			return nil, err
		}
		f.ix, f.ixCfg = ix, icfg
	}
	if !isCacheGreedy(policy) {
		rcfg := cfg.Routing
		rcfg.Policy, rcfg.Now = routingPolicy(policy), f.clock
		if rcfg.Policy == "session" && rcfg.SessionFallback == "" {
			// As production-stack's and LiteLLM's session routers: a
			// request without a session goes by load.
			rcfg.SessionFallback = "least_load"
		}
		rcfg.Rand = rand.New(rand.NewPCG(seed, 0x4047))
		if cfg.Routers > 1 && !cfg.NoStripes && rcfg.Routers == 0 {
			rcfg.Routers, rcfg.RouterIndex = cfg.Routers, 0 // addPeers sets the others' index
		}
		if rcfg.PrefillRate == 0 {
			rcfg.PrefillRate = cfg.prefillRate()
		}
		if cfg.Rates == RatesLearned && rcfg.LearnRates.Mode == "" {
			rcfg.LearnRates.Mode = routing.LearnOn
		} else if cfg.Rates != RatesLearned {
			rcfg.LearnRates.Mode = routing.LearnOff
		}
		var ix routing.Index
		if f.ix != nil {
			ix = f.ix
		}
		r, err := routing.New(rcfg, ix, nil, nil)
		if err != nil {
			return nil, err
		}
		f.router, f.rCfg = r, rcfg
		if err := f.addPeers(seed); err != nil {
			return nil, err
		}
	}
	if err := f.addReplicas(cfg.Replicas); err != nil {
		return nil, err
	}
	f.pd = newPDState(&f.cfg, policy)
	if f.pd != nil {
		f.pd.remoteAt = make([]bool, len(w.Requests))
	}
	return f, nil
}

// expectedEntries is how many blocks the fleet's engines can hold at its
// largest (GPU and CPU tiers), to size the index for (as kvrouter's
// index.expected_entries), and no more than the workload's prompts and
// outputs fill.
func (f *fleet) expectedEntries() (int, error) {
	cfg := &f.cfg
	gpu, err := f.gpuBlocks()
	if err != nil {
		return 0, err
	}
	n, peak := cfg.Replicas, cfg.Replicas*max(cfg.DPSize, 1)
	for _, s := range cfg.Scale { // sorted by time
		n += s.Delta
		peak = max(peak, n)
	}
	bs, used := f.blockSize(), 0
	for i := range f.w.Requests {
		r := &f.w.Requests[i]
		used += (r.InputTokens() + r.OutputTokens + bs - 1) / bs
	}
	return min(peak*(max(gpu-1, 0)+cfg.Engine.NumCPUBlocks), used), nil
}

// gpuBlocks is one engine's KV cache size in blocks as vLLM reports it
// (num_gpu_blocks): the configured one, else the profile's.
func (f *fleet) gpuBlocks() (int, error) {
	if n := f.cfg.Engine.NumGPUBlocks; n > 0 {
		return n, nil
	}
	_, blocks, err := enginesim.Profile(f.cfg.Engine.Profile)
	return blocks, err
}

func (f *fleet) blockSize() int {
	if f.cfg.Engine.BlockSize > 0 {
		return f.cfg.Engine.BlockSize
	}
	return enginesim.DefaultBlockSize
}

func (f *fleet) addReplicas(n int) error {
	if f.cfg.DPSize > 1 {
		return f.addDPEngines(n) // dp.go
	}
	for range n {
		ecfg := f.cfg.Engine
		ecfg.NoEvents = f.ix == nil
		rate := f.cfg.prefillRate()
		if sc := f.cfg.PrefillScale; len(sc) > 0 {
			rate *= sc[len(f.reps)%len(sc)]
			ecfg.Timing.PrefillTokensPerSec = rate
		}
		core, err := enginesim.NewCore(ecfg)
		if err != nil {
			return err
		}
		r := &replica{name: fmt.Sprintf("r%02d", len(f.reps)), core: core}
		r.route = r.name
		f.byName[r.name] = len(f.reps)
		f.reps = append(f.reps, r)
		f.run.Replicas = append(f.run.Replicas, r.name)
		gpu, _ := f.gpuBlocks() // NewCore accepted the profile
		f.eachRouter(func(rt *routing.Router) {
			rt.AddReplica(r.name)
			rt.SetCapacity(r.name, gpu) // as serve from vllm:cache_config_info
			switch f.cfg.Rates {
			case RatesKnown:
				rt.SetRates(r.name, rate, 0)
			case RatesLearned:
				rt.ObserveRates(r.name, rateSample(core, f.clock()))
			}
		})
	}
	return nil
}

// rateSample reads a Core's counters as serve reads an engine's /metrics.
func rateSample(c *enginesim.Core, at time.Time) routing.RateSample {
	s := c.Stats()
	return routing.RateSample{At: at, PrefillTokens: float64(s.PrefillComputedTokens), PrefillSeconds: s.PrefillSeconds,
		DecodeTokens: float64(s.GenerationTokens), DecodeSeconds: s.DecodeSeconds}
}

// simulate runs the whole workload and returns the policy's Run.
func (f *fleet) simulate(ctx context.Context) (*report.Run, error) {
	defer f.stopPipeline()
	if f.cfg.Pipeline == PipelineOn {
		f.startPipeline()
	}
	for i := range f.w.Requests {
		f.q.push(event{at: f.w.Requests[i].At, kind: evArrival, i: i})
	}
	for i, s := range f.cfg.Scale {
		f.q.push(event{at: s.At, kind: evScale, i: i})
	}
	if f.cfg.GaugeInterval > 0 && f.router != nil {
		f.q.push(event{at: 0, kind: evGauges})
	}
	for n := 0; f.q.len() > 0; n++ {
		if n%4096 == 0 && ctx.Err() != nil {
			return nil, ctx.Err()
		}
		e := f.q.pop()
		f.now = e.at
		switch e.kind {
		case evArrival:
			if err := f.arrive(e.i); err != nil {
				return nil, err
			}
		case evScale:
			if err := f.scale(f.cfg.Scale[e.i].Delta); err != nil {
				return nil, err
			}
		case evKick:
			f.reps[e.rep].kicked = false
			if !f.reps[e.rep].stepping {
				f.step(e.rep)
			}
		case evStepEnd:
			if err := f.stepEnd(e.rep); err != nil {
				return nil, err
			}
		case evDeliver:
			if err := f.deliver(e.rep, e.i); err != nil {
				return nil, err
			}
		case evTransfer:
			f.transferDone(e.i)
		case evGauges:
			f.gauges()
			if f.q.len() > 0 {
				f.q.push(event{at: f.now + f.cfg.GaugeInterval, kind: evGauges})
			}
		}
	}
	if err := f.syncIndex(); err != nil {
		return nil, err
	}
	var pre int64
	for _, r := range f.reps {
		pre += r.core.Stats().Preemptions
	}
	f.run.Preemptions = pre
	if len(f.live) != 0 {
		return nil, fmt.Errorf("sim %s: %d requests never finished", f.policy, len(f.live))
	}
	return f.run, nil
}

// arrive routes request i and submits it to the chosen replica's core. It
// fails only when the pipeline does.
func (f *fleet) arrive(i int) error {
	if f.pd != nil {
		return f.arrivePD(i)
	}
	r := &f.w.Requests[i]
	f.toks = r.AppendTokens(f.toks[:0])
	out := max(r.OutputTokens, 1)
	s := &f.run.Samples[i]
	*s = report.Sample{ID: r.ID, Arrival: f.now, End: f.now, PromptTokens: len(f.toks)}
	var rep int
	var lease *routing.Lease
	if f.router == nil {
		rep = f.greedyPick()
	} else {
		req := routing.Request{ID: r.ID, Tokens: f.toks, MaxTokens: out, SessionKey: r.Session,
			Extras: kvindex.Extras{LoRA: r.LoRA}, Exclude: f.lacking(r.LoRA)}
		if f.cfg.Draw != 0 && r.Session != "" {
			req.SessionKey = r.Session + "#" + strconv.FormatUint(f.cfg.Draw, 10)
		}
		if f.policy == "prefix_chars" {
			req.Text = f.tokenText()
		}
		if err := f.syncIndex(); err != nil {
			return err
		}
		d, l, err := f.pickRouter().Route(&req)
		if err != nil {
			s.Err = "no_replica"
			return nil
		}
		rep, lease = f.byName[d.Name], l
		if f.lb != nil {
			rep = f.lb[rep].pick(f, rep) // vLLM's own balancer picks the rank (dp.go)
		}
		if f.rec != nil {
			f.rec[i] = f.record(&d, len(f.toks))
		}
	}
	s.Replica = f.reps[rep].name
	err := f.reps[rep].core.Submit(&enginesim.Request{ID: r.ID, Tokens: f.toks, MaxTokens: out, LoRAName: r.LoRA, ReportHits: f.ix != nil})
	if err != nil {
		s.Err = "rejected"
		if !errors.Is(err, enginesim.ErrInvalidRequest) {
			s.Err = "duplicate"
		}
		if lease != nil {
			lease.Release()
		}
		return nil
	}
	f.live[r.ID] = &inflight{sample: i, rep: rep, lease: lease}
	f.reps[rep].load++
	f.kick(rep)
	return nil
}

// tokenText renders the prompt as prefix_chars' routing text, as the
// proxy does for a token-id prompt (routing.TokenText).
func (f *fleet) tokenText() string {
	f.text = routing.AppendTokenText(f.text[:0], f.toks)
	return string(f.text)
}

// kick makes replica rep start a step at the current time, after every
// other event of this instant, unless it is already stepping.
func (f *fleet) kick(rep int) {
	r := f.reps[rep]
	if r.stepping || r.kicked {
		return
	}
	r.kicked = true
	f.q.push(event{at: f.now, kind: evKick, rep: rep})
}

// step runs one engine step now; its effects land when it ends.
func (f *fleet) step(rep int) {
	r := f.reps[rep]
	if r.core.Idle() {
		return
	}
	r.res = r.core.Step()
	if len(r.res.Transfers) > 0 {
		f.startTransfers(rep, r.res.Transfers)
	}
	if r.res.Duration <= 0 {
		// Nothing could be scheduled (cannot happen with work waiting and
		// a valid config, but never spin): wait for the next arrival.
		return
	}
	r.stepping = true
	f.q.push(event{at: f.now + r.res.Duration, kind: evStepEnd, rep: rep})
}

// stepEnd applies the finished step's outputs and events, then starts the
// next step if the replica has work. It fails only when the pipeline does.
func (f *fleet) stepEnd(rep int) error {
	r := f.reps[rep]
	r.stepping = false
	for _, o := range r.res.Outputs {
		fl := f.live[o.ID]
		if fl == nil {
			continue
		}
		if fl.prefillLeg {
			f.prefillOutput(fl, &o, rep)
			continue
		}
		s := &f.run.Samples[fl.sample]
		if o.Index == 0 {
			s.FirstToken = f.now
			if !fl.remote {
				s.CachedTokens = o.CachedTokens
			}
			if fl.lease != nil {
				fl.lease.FirstToken()
			}
		} else {
			f.run.ITL.Add(f.now - fl.last)
		}
		fl.last = f.now
		if o.Finished {
			s.End = f.now
			s.OutputTokens = o.Index + 1
			if fl.lease != nil {
				fl.lease.Release()
			}
			r.load--
			delete(f.live, o.ID)
		}
	}
	if len(r.res.Events) > 0 && f.ix != nil {
		if err := f.publish(rep, r.res.Events); err != nil {
			return err
		}
	}
	f.step(rep)
	return nil
}

// publish sends a step's KV events towards the index after EventDelay
// unless lost. Without delay the batch is applied from the core's own
// slice (valid until its next Step; the pipeline copies it); a delayed
// batch is copied into a reused slot (and copied again by the pipeline on
// delivery).
func (f *fleet) publish(rep int, evs []vllm.Event) error {
	if f.cfg.EventLoss > 0 && f.rng.Float64() < f.cfg.EventLoss {
		return nil
	}
	ts := f.clock().Sub(time.Unix(0, 0)).Seconds()
	if f.cfg.EventDelay == 0 {
		b := vllm.Batch{TS: ts, Events: evs, DataParallelRank: f.reps[rep].rank}
		return f.apply(rep, &b)
	}
	slot := len(f.batches)
	if n := len(f.free); n > 0 {
		slot, f.free = f.free[n-1], f.free[:n-1]
	} else {
		f.batches = append(f.batches, vllm.Batch{})
	}
	f.batches[slot] = vllm.Batch{TS: ts, Events: append(f.batches[slot].Events[:0], evs...), DataParallelRank: f.reps[rep].rank}
	f.q.push(event{at: f.now + f.cfg.EventDelay, kind: evDeliver, rep: rep, i: slot})
	return nil
}

func (f *fleet) deliver(rep, slot int) error {
	err := f.apply(rep, &f.batches[slot])
	clear(f.batches[slot].Events) // keep the capacity, not the slices
	f.batches[slot].Events = f.batches[slot].Events[:0]
	f.free = append(f.free, slot)
	return err
}

// apply feeds a batch to the index now, or queues it on the pipeline,
// unless the replica was removed (the index would register it again). It
// fails only when the pipeline does.
func (f *fleet) apply(rep int, b *vllm.Batch) error {
	r := f.reps[rep]
	if r.removed {
		return nil
	}
	if f.pipe != nil {
		if err := f.pipe.push(r.route, f.now, b); err != nil {
			return fmt.Errorf("sim %s: %w", f.policy, err)
		}
		return nil
	}
	f.ixAt = f.now
	f.ix.Apply(r.route, b)
	f.applyPeers(r.route, b)
	return nil
}

// gauges refreshes the router's view of every engine's gauges.
func (f *fleet) gauges() {
	at := f.clock()
	if f.lb != nil {
		f.dpGauges(at) // dp.go
		return
	}
	for _, r := range f.reps {
		if !r.removed {
			g := routing.Gauges{Waiting: r.core.Waiting(), Running: r.core.Running(), KVUsage: r.core.KVUsage(), At: at}
			var rs routing.RateSample
			if f.cfg.Rates == RatesLearned {
				rs = rateSample(r.core, at)
			}
			f.eachRouter(func(rt *routing.Router) {
				rt.ObserveGauges(r.name, g)
				if f.cfg.Rates == RatesLearned {
					rt.ObserveRates(r.name, rs)
				}
			})
		}
	}
}

// scale adds or removes replicas now.
func (f *fleet) scale(delta int) error {
	if err := f.syncIndex(); err != nil {
		return err
	}
	if delta > 0 {
		return f.addReplicas(delta)
	}
	for i := len(f.reps) - 1; i >= 0 && delta < 0; i-- {
		r := f.reps[i]
		if r.removed {
			continue
		}
		r.removed = true
		delta++
		f.eachRouter(func(rt *routing.Router) { rt.RemoveReplica(r.name) })
	}
	return nil
}

// greedyPick (PolicyCacheGreedy) routes with global knowledge of every engine: among the
// replicas with the fewest waiting requests (the engine's own queue, read
// now), the one holding the longest GPU prefix of the prompt (its prefix
// cache, read now: the blocks of steps under way included, as an index fed
// instantly and losslessly at scheduling would hold), ties to the fewest
// running, then the lowest index. Greedy for cache without ever queueing
// behind a busier replica, it shows the hit rate perfect knowledge reaches
// at this load (it is not an upper bound: it gives up cache to avoid any
// queue, where kv weighs the two). Only replicas with the fewest waiting are probed.
func (f *fleet) greedyPick() int {
	minWait := -1
	for _, r := range f.reps {
		if w := r.core.Waiting(); !r.removed && (minWait < 0 || w < minWait) {
			minWait = w
		}
	}
	// Every core has the same block size and hash seed: one computes the
	// fleet's hashes.
	f.hashes = f.reps[0].core.PrefixHashes(f.hashes[:0], f.toks)
	best, bestHit := -1, -1
	for i, r := range f.reps {
		if r.removed || r.core.Waiting() != minWait {
			continue
		}
		hit := r.core.CachedPrefix(f.hashes)
		switch {
		case best < 0, hit > bestHit:
		case hit == bestHit && r.core.Running() < f.reps[best].core.Running():
		default:
			continue
		}
		best, bestHit = i, hit
	}
	return best
}
