package sim

import (
	"context"
	"errors"
	"fmt"

	"kvrouter/internal/enginesim"
	"kvrouter/internal/workload"
)

// Bound is the pooled-cache bound on a workload: the prefix cache hits of
// one engine whose cache is the whole fleet's (see PooledBound).
type Bound struct {
	// GPUBlocks and CPUBlocks are the pooled cache's usable GPU blocks and
	// CPU-tier blocks: the peak fleet's replicas times each engine's
	// usable GPU blocks (NumGPUBlocks - 1) and CPU blocks.
	GPUBlocks, CPUBlocks int
	// PromptTokens and CachedTokens sum the prompts and their cached tokens
	// (GPU and CPU tier, usage cached_tokens) over the requests the engines
	// accept.
	PromptTokens, CachedTokens int64
	// HitRate is CachedTokens / PromptTokens (0 without prompts).
	HitRate float64
	// CachedPerRequest holds each request's cached tokens, in workload
	// order (0 for a rejected request).
	CachedPerRequest []int
}

// PooledBound computes the pooled-cache bound of w under cfg: the hits of a
// single enginesim.Core whose GPU cache holds every usable block of the
// fleet at its largest (cfg.Replicas plus the scale-ups of cfg.Scale), and
// whose CPU tier holds every replica's CPU blocks, serving w's requests one
// at a time in arrival order, each to its end. The cache is engine-sim's own
// (the same Core code: block size, LRU of unreferenced blocks freed last
// block first, at most prompt length - 1 tokens hit in whole blocks, decode
// blocks cached and occupying space, CPU tier filled by GPU evictions), so
// the bound differs from a fleet only by having no placement constraint
// (any request reaches every block) and no concurrency (no request holds
// blocks while another runs, so none evicts for lack of room or is
// preempted).
//
// It is a reference, not a proof: LRU is not the optimal replacement, so a
// placement that keeps a scan away from a hot set could beat it; the tests
// check that no policy does on the simulator's scenarios. The fleet at its
// largest is used for the whole run (scale-out: more room than the fleet has
// before it grows). Errors: a bad engine config, or ctx cancelled.
func PooledBound(ctx context.Context, cfg Config, w *workload.Workload) (Bound, error) {
	return pooledBound(ctx, cfg, w, false)
}

// pooledBound is PooledBound; stepDecode runs every decode step through
// Step (as before enginesim.Core.DecodeAlone; the tests compare the two).
func pooledBound(ctx context.Context, cfg Config, w *workload.Workload, stepDecode bool) (Bound, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return Bound{}, fmt.Errorf("sim: pooled bound: %w", err)
	}
	ecfg := cfg.Engine
	gpu := ecfg.NumGPUBlocks
	if gpu == 0 {
		_, blocks, err := enginesim.Profile(ecfg.Profile)
		if err != nil {
			return Bound{}, fmt.Errorf("sim: pooled bound: %w", err)
		}
		gpu = blocks
	}
	peak, n := cfg.Replicas, cfg.Replicas
	for _, s := range cfg.Scale {
		n += s.Delta
		peak = max(peak, n)
	}
	b := Bound{GPUBlocks: peak * (gpu - 1), CPUBlocks: peak * ecfg.NumCPUBlocks}
	ecfg.NumGPUBlocks = b.GPUBlocks + 1
	ecfg.NumCPUBlocks = b.CPUBlocks
	ecfg.MaxNumSeqs = 1
	ecfg.NoEvents = true
	core, err := enginesim.NewCore(ecfg)
	if err != nil {
		return Bound{}, fmt.Errorf("sim: pooled bound: %w", err)
	}
	b.CachedPerRequest = make([]int, len(w.Requests))
	var toks []uint32
	for i := range w.Requests {
		if i%256 == 0 && ctx.Err() != nil {
			return Bound{}, ctx.Err()
		}
		r := &w.Requests[i]
		toks = r.AppendTokens(toks[:0])
		err := core.Submit(&enginesim.Request{ID: r.ID, Tokens: toks, MaxTokens: max(r.OutputTokens, 1), LoRAName: r.LoRA})
		if errors.Is(err, enginesim.ErrInvalidRequest) {
			continue // the fleet's engines reject it too
		}
		if err != nil {
			return Bound{}, fmt.Errorf("sim: pooled bound: %w", err)
		}
		cached := -1
		for !core.Idle() {
			res := core.Step()
			for _, o := range res.Outputs {
				if o.Index == 0 {
					cached = o.CachedTokens
				}
			}
			if res.Duration <= 0 {
				return Bound{}, fmt.Errorf("sim: pooled bound: request %s cannot be scheduled", r.ID)
			}
			if !stepDecode {
				core.DecodeAlone() // the decode steps at once, as Step would run them
			}
		}
		b.PromptTokens += int64(len(toks))
		b.CachedTokens += int64(cached)
		b.CachedPerRequest[i] = cached
	}
	if b.PromptTokens > 0 {
		b.HitRate = float64(b.CachedTokens) / float64(b.PromptTokens)
	}
	return b, nil
}
