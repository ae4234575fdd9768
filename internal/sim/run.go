package sim

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"runtime"
	"sync"
	"sync/atomic"

	"kvrouter/internal/bench/report"
	"kvrouter/internal/enginesim"
	"kvrouter/internal/workload"
)

func nan() float64 { return math.NaN() }

// prefillRate is the engines' prefill throughput in tokens/s under cfg.
func (cfg *Config) prefillRate() float64 {
	if r := cfg.Engine.Timing.PrefillTokensPerSec; r > 0 {
		return r
	}
	t, _, err := enginesim.Profile(cfg.Engine.Profile)
	if err != nil {
		return 0
	}
	return t.PrefillTokensPerSec
}

// Run simulates every policy of cfg on w, Parallel policies at a time, and
// returns their Runs in cfg.Policies order. Errors: a bad config (all
// problems joined), ctx cancelled, or a request that never finished (a bug).
func Run(ctx context.Context, cfg Config, w *workload.Workload) ([]*report.Run, error) {
	runs, _, err := run(ctx, cfg, w, false)
	return runs, err
}

// run is Run; with record, it also returns each policy's routing decisions
// (per request, nil for policies without an index).
func run(ctx context.Context, cfg Config, w *workload.Workload, record bool) ([]*report.Run, [][]decisionRec, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, nil, fmt.Errorf("sim: %w", err)
	}
	recs := make([][]decisionRec, len(cfg.Policies))
	runs := make([]*report.Run, len(cfg.Policies))
	errs := make([]error, len(cfg.Policies))
	sem := make(chan struct{}, cfg.Parallel)
	// Under PipelineAuto a fleet pipelines once fewer policies remain than
	// cores: then at most that many run, and a core is free for good.
	var left atomic.Int64
	left.Store(int64(len(cfg.Policies)))
	procs := int64(runtime.GOMAXPROCS(0))
	coreFree := func() bool { return min(left.Load(), int64(cfg.Parallel)) < procs }
	var wg sync.WaitGroup
	for _, i := range startOrder(cfg.Policies) {
		p := cfg.Policies[i]
		sem <- struct{}{} // start in startOrder, Parallel at a time
		wg.Go(func() {
			defer func() { <-sem }()
			defer left.Add(-1)
			defer func() {
				if v := recover(); v != nil {
					errs[i] = fmt.Errorf("sim %s: panic: %v", p, v)
				}
			}()
			f, err := newFleet(cfg, p, w, policySeed(cfg.Seed, cfg.Draw, p))
			if err != nil {
				errs[i] = fmt.Errorf("sim %s: %w", p, err)
				return
			}
			if cfg.Pipeline == PipelineAuto {
				f.coreFree = coreFree
			}
			if record && f.ix != nil {
				f.rec = make([]decisionRec, len(w.Requests))
			}
			runs[i], errs[i] = f.simulate(ctx)
			recs[i] = f.rec
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, nil, err
	}
	return runs, recs, nil
}

// startOrder returns the indices of policies, those that keep a prefix index
// first: they cost the most, so starting them first shortens the run when
// policies share fewer cores than there are policies.
func startOrder(policies []string) []int {
	order := make([]int, 0, len(policies))
	for pass := range 2 {
		for i, p := range policies {
			cheap := p == "round_robin" || p == "least_load" || p == "random" || p == "session"
			if cheap == (pass == 1) {
				order = append(order, i)
			}
		}
	}
	return order
}

// policySeed is policy's seed in a run seeded with seed at draw
// (Config.Draw): from its name, not its place in Config.Policies, so that a
// policy's run is the same whichever other policies run with it.
func policySeed(seed, draw uint64, policy string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(policy))
	if draw != 0 {
		h.Write(binary.LittleEndian.AppendUint64(nil, draw))
	}
	return seed ^ h.Sum64()
}
