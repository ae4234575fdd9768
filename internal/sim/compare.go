package sim

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"kvrouter/internal/bench/report"
	"kvrouter/internal/enginesim"
	"kvrouter/internal/workload"
)

// ErrConfig marks a Study that Compare cannot run: an unknown scenario, a
// repeat count or data-parallel size the fleet cannot take (a usage error
// of the command that filled it). Its text is "usage".
var ErrConfig = errors.New("usage")

// Study is one "kvrouter sim" comparison: a scenario built at one or more
// offered loads, every policy of Sim simulated on the same arrivals.
type Study struct {
	// Scenario names the workload and regime (Scenarios); Trace is the
	// trace of the trace scenarios (mooncake, saturation).
	Scenario string
	Trace    []workload.TraceRecord
	// Replicas at the end of the run; Requests of synthetic scenarios (0:
	// their default) or the first records of a trace (0: all); Repeat
	// copies of the workload back to back (1: once).
	Replicas, Requests, Repeat int
	// Loads are the offered loads (0: the scenario's default); more than
	// one is a sweep, whose goodput against load the report carries.
	Loads []float64
	// Speed, when > 0, divides a mooncake trace's inter-arrival times
	// instead of deriving them from the load.
	Speed float64
	// Scale are fleet changes beside the scenario's own.
	Scale []Scale
	// DPSize > 1 groups the replicas into engines of that many ranks;
	// DPRankBlind routes to engines and lets vLLM's balancer pick a rank.
	DPSize      int
	DPRankBlind bool
	// Pooled also computes the pooled-cache bound; Attribute attributes
	// each policy's cached tokens lost against it (Attribute).
	Pooled, Attribute bool
	// PoliciesSet: Sim.Policies were chosen, not the default list (which
	// drops the oracle on scenarios with adapters).
	PoliciesSet bool
	// PrefillScaleText is the --prefill-scale text, for the report's
	// setup.
	PrefillScaleText string
	// Sim is the simulation's configuration; Replicas, Scale, DPSize and
	// AdapterReplicas are set from the scenario at each load.
	Sim Config
}

// Compare runs s: each load's scenario simulated with every policy (and
// the pooled-cache bound, memoised over a sweep), and returns the last
// load's report (with the sweep's points) and, with Attribute, the last
// run's attribution.
func Compare(ctx context.Context, s Study) (*report.Report, []Attribution, error) {
	timing, _, err := enginesim.Profile(s.Sim.Engine.Profile)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %v", ErrConfig, err)
	}
	prefillRate := timing.PrefillTokensPerSec * mean(s.Sim.PrefillScale)
	var attrs []Attribution // the last run's, with Attribute
	bounds := &BoundMemo{}  // a load sweep over a trace replays the same requests: one bound
	var rep *report.Report
	var sweep []report.SweepPoint
	for _, load := range s.Loads {
		r, used, at, err := s.one(ctx, load, prefillRate, bounds)
		if err != nil {
			return nil, nil, err
		}
		attrs = at
		if len(s.Loads) > 1 {
			r.Sweep = sweep
			r.AddSweep(used, r)
			sweep = r.Sweep
		}
		rep = r
	}
	if pd := s.Sim.PD; pd.PrefillReplicas != 0 {
		rep.Setup["pd_prefill"], rep.Setup["pd_link"] = strconv.Itoa(pd.PrefillReplicas), pd.Rule.Link
	}
	return rep, attrs, nil
}

// one simulates the scenario at load (0: its default) and reports it,
// with the load used.
func (s *Study) one(ctx context.Context, load, prefillRate float64, bounds *BoundMemo) (*report.Report, float64, []Attribution, error) {
	cfg := &s.Sim
	opts := ScenarioOptions{Replicas: s.Replicas, Load: load, Requests: s.Requests, PrefillRate: prefillRate, Seed: cfg.Seed, Trace: s.Trace}
	sc, err := BuildScenario(s.Scenario, opts)
	if err != nil {
		return nil, 0, nil, fmt.Errorf("%w: %v", ErrConfig, err)
	}
	if s.Speed > 0 && sc.Workload.Name == "mooncake" {
		if sc.Workload, err = workload.Mooncake(opts.Trace, workload.MooncakeOptions{Speed: s.Speed, Limit: s.Requests}); err != nil {
			return nil, 0, nil, err
		}
		sc.Workload.Params["scenario"] = s.Scenario
	}
	w := sc.Workload
	if s.Repeat != 1 {
		if w, err = workload.Repeat(w, s.Repeat); err != nil {
			return nil, 0, nil, fmt.Errorf("%w: %v", ErrConfig, err)
		}
	}
	cfg.Replicas = sc.Replicas
	if s.DPSize > 1 {
		if sc.Replicas%s.DPSize != 0 {
			return nil, 0, nil, fmt.Errorf("%w: --dp-size %d does not divide %d replicas", ErrConfig, s.DPSize, sc.Replicas)
		}
		cfg.Replicas, cfg.DPSize, cfg.DPRankBlind = sc.Replicas/s.DPSize, s.DPSize, s.DPRankBlind
	}
	cfg.Scale = append(sc.Scale, s.Scale...)
	if cfg.AdapterReplicas = sc.AdapterReplicas; cfg.AdapterReplicas > 0 && !s.PoliciesSet {
		// The oracle does not model adapters: the default list without it.
		cfg.Policies = slices.DeleteFunc(cfg.Policies, func(p string) bool { return p == PolicyOracle })
	}
	start := time.Now()
	runs, bound, attrs, err := simulate(ctx, *cfg, w, s.Pooled, s.Attribute, bounds)
	if err != nil {
		return nil, 0, nil, err
	}
	title := fmt.Sprintf("kvrouter sim: %s, %d replicas, load %.2g", s.Scenario, s.Replicas, sc.Load)
	rep := report.New(title, w.Info(), runs, cfg.SLO)
	rep.HitRateBound = HitRateBound(w, cfg.Engine.BlockSize)
	if bound != nil {
		rep.SetPooledBound(report.PooledBound{HitRate: bound.HitRate, CachedTokens: bound.CachedTokens, GPUBlocks: bound.GPUBlocks, CPUBlocks: bound.CPUBlocks})
	}
	rep.Setup = map[string]string{
		"replicas": strconv.Itoa(s.Replicas), "start_replicas": strconv.Itoa(sc.Replicas), "profile": cfg.Engine.Profile,
		"block_size": strconv.Itoa(cfg.Engine.BlockSize), "event_delay": cfg.EventDelay.String(), "event_loss": fmt.Sprint(cfg.EventLoss),
		"seed": fmt.Sprint(cfg.Seed), "wall_time": time.Since(start).Round(time.Millisecond).String(),
	}
	if len(cfg.PrefillScale) > 0 {
		rep.Setup["prefill_scale"], rep.Setup["rates"] = s.PrefillScaleText, cfg.Rates
	}
	if cfg.Routers > 1 {
		rep.Setup["routers"], rep.Setup["front"] = strconv.Itoa(cfg.Routers), cfg.Front
		rep.Setup["stripes"] = strconv.FormatBool(!cfg.NoStripes)
	}
	if s.DPSize > 1 {
		rep.Setup["dp_size"], rep.Setup["dp_rank_blind"] = strconv.Itoa(s.DPSize), strconv.FormatBool(s.DPRankBlind)
	}
	for _, sc := range cfg.Scale {
		rep.Setup["scale"] += fmt.Sprintf("%v:%+d ", sc.At.Round(time.Second), sc.Delta)
	}
	return rep, sc.Load, attrs, nil
}

// simulate runs cfg's policies on w and, when pooled, the pooled-cache
// bound (from bounds when it holds w's) on its own goroutine beside them
// (nil bound otherwise); attribute runs Attribute instead (bound, then
// policies, and the attribution).
func simulate(ctx context.Context, cfg Config, w *workload.Workload, pooled, attribute bool, bounds *BoundMemo) ([]*report.Run, *Bound, []Attribution, error) {
	if attribute {
		runs, attrs, b, err := Attribute(ctx, cfg, w)
		if err != nil {
			return nil, nil, nil, err
		}
		return runs, &b, attrs, nil
	}
	if !pooled {
		runs, err := Run(ctx, cfg, w)
		return runs, nil, nil, err
	}
	type result struct {
		b   Bound
		err error
	}
	ch := make(chan result, 1)
	bctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		defer func() {
			if v := recover(); v != nil {
				ch <- result{err: fmt.Errorf("sim: pooled bound: panic: %v", v)}
			}
		}()
		b, err := bounds.PooledBound(bctx, cfg, w)
		ch <- result{b, err}
	}()
	runs, err := Run(ctx, cfg, w)
	if err != nil {
		cancel()
	}
	r := <-ch
	if err != nil {
		return nil, nil, nil, err
	}
	if r.err != nil {
		return nil, nil, nil, r.err
	}
	return runs, &r.b, nil, nil
}

// mean is the average of xs, 1 for none.
func mean(xs []float64) float64 {
	if len(xs) == 0 {
		return 1
	}
	sum := 0.0
	for _, x := range xs {
		sum += x
	}
	return sum / float64(len(xs))
}
