package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"kvrouter"
	"kvrouter/internal/bench/report"
	"kvrouter/internal/enginesim"
	"kvrouter/internal/routing"
	"kvrouter/internal/sim"
	"kvrouter/internal/workload"
)

// embeddedTrace is the Mooncake trace inside the binary (kvrouter.Assets).
const embeddedTrace = "testdata/mooncake/conversation_trace.jsonl.gz"

// runSim implements "kvrouter sim": build a scenario, simulate every policy
// on it, print the comparison.
func runSim(ctx context.Context, args []string, sio stdio) error {
	var names []string
	for _, s := range sim.Scenarios() {
		names = append(names, s.Name)
	}
	fs := newFlagSet("sim", "[flags]\n\nSimulates a fleet of engine-sim cores on a virtual clock with the real index and\npolicies, every policy on the same arrivals, and prints a comparison table.\n\nscenarios:\n"+scenarioList(), sio.err)
	scenario := fs.String("scenario", "mooncake", "workload and regime: "+strings.Join(names, ", "))
	tracePath := fs.String("trace", "", "trace file, JSON lines or gzip: Mooncake lines (optional session_id) or Qwen-Bailian lines (chat_id, parent_chat_id, 16-token hash_ids: one session per conversation) (default: the Mooncake conversation trace embedded in the binary)")
	replicas := fs.Int("replicas", sim.DefaultReplicas, "replicas at the end of the run (scale_out starts with half)")
	policies := fs.String("policies", strings.Join(sim.DefaultPolicies(), ","), "comma-separated policies to compare: "+strings.Join(sim.Policies(), ", "))
	loadFlag := fs.String("load", "0", "offered load: prompt tokens per second over the fleet's prefill capacity, as if nothing were cached (0: the scenario's default: "+defaultLoads()+"); a comma-separated list sweeps the loads and adds goodput against load to the report")
	speed := fs.Float64("speed", 0, "mooncake and saturation: divide the trace's inter-arrival times by this instead of deriving it from --load")
	requests := fs.Int("requests", 0, "requests of synthetic scenarios (0: 4000); for trace scenarios, replay only the first N records (0: all)")
	repeat := fs.Int("repeat", 1, "replay the workload this many times back to back, each copy with its own tokens (1..8)")
	profile := fs.String("profile", enginesim.ProfileH100, "engine timing profile: "+strings.Join(enginesim.ProfileNames(), ", "))
	blockSize := fs.Int("block-size", enginesim.DefaultBlockSize, "engine KV block size in tokens")
	gpuBlocks := fs.Int("num-gpu-blocks", 0, "engine KV cache size in blocks (0: the profile's, 27000)")
	maxModelLen := fs.Int("max-model-len", 0, "engine context length in tokens; longer requests are rejected (0: 131072, or what --num-gpu-blocks holds if less)")
	maxSeqs := fs.Int("max-num-seqs", 0, "engine max running sequences (0: 1024)")
	maxBatched := fs.Int("max-num-batched-tokens", 0, "engine token budget per step (0: 8192)")
	eventDelay := fs.Duration("event-delay", 0, "KV event delivery delay from engine to index")
	eventLoss := fs.Float64("event-loss", 0, "probability (0..1) that a KV event batch is lost")
	gaugeInterval := fs.Duration("gauge-interval", sim.DefaultGaugeInterval, "how often the router refreshes engine gauges (negative: never)")
	scale := fs.String("scale", "", "extra fleet changes, comma-separated TIME:DELTA, e.g. 120s:+4,300s:-2 (added replicas start cold; removed ones drain)")
	routingFile := fs.String("routing", "", "YAML file with routing weights (routing.Config fields: kv, dynamo, llmd, sglang, prefill_rate, ...)")
	sloTTFT := fs.Duration("slo-ttft", sim.DefaultSLOTTFT, "goodput SLO on time to first token")
	sloITL := fs.Duration("slo-itl", sim.DefaultSLOITL, "goodput SLO on mean time per output token after the first")
	seed := fs.Uint64("seed", 1, "random seed (generators, arrivals, tie-breaks, event loss)")
	parallel := fs.Int("parallel", 0, "policies simulated at once (0: GOMAXPROCS)")
	pipeline := fs.String("pipeline", string(sim.PipelineAuto), "apply a policy's KV events to its index on a second goroutine (same results, less wall time when a core is free): auto (once fewer policies remain than GOMAXPROCS), on, off")
	prefillScale := fs.String("prefill-scale", "", "heterogeneous fleet: comma-separated factors on the profile's prefill rate, replica i taking factor i mod n (e.g. 1,0.4: half the replicas at 0.4x); --load counts the mean")
	rates := fs.String("rates", sim.RatesConfigured, "prefill rates the router uses: configured (the --routing file's, else the profile's, for every replica), known (each replica's true rate), learned (from the engines' counters, as serve learns from /metrics)")
	routers := fs.Int("routers", 1, "router replicas (1..64), each with its own leases, index and predictions, fed the same KV events and gauges")
	front := fs.String("front", sim.FrontRoundRobin, "with --routers > 1: the balancer in front of them, round_robin or random")
	stripes := fs.Bool("stripes", true, "with --routers > 1: configure router replica k of N with routing routers N, router_index k (striped tie-breaks and the kv stripe slack; false: the replicas know nothing of each other)")
	pooled := fs.Bool("pooled-bound", true, "also compute the pooled-cache bound (the fleet's blocks as one LRU; about one cache-blind policy's CPU, on its own goroutine beside the policies) and each policy's share of it")
	attribute := fs.Bool("attribute", false, "also attribute each indexed policy's cached tokens lost against the pooled-cache bound to causes (split from the replica holding more, gone between decision and admission, evicted from every replica) and print that table after the report (markdown only)")
	asJSON := fs.Bool("json", false, "print the report as JSON instead of a markdown table")
	htmlPath := fs.String("html", "", "also write a self-contained HTML report with plots to this file")
	dpSize := fs.Int("dp-size", 1, "data-parallel fleet: --replicas ranks grouped into engines of this many ranks behind one endpoint, each rank its own cache and queue; the router sees ranks as candidates (kvrouter's dp_size) unless --dp-rank-blind")
	dpBlind := fs.Bool("dp-rank-blind", false, "with --dp-size > 1: route to engines and let vLLM's balancer pick the rank (waiting*4 + running)")
	pdPrefill := fs.Int("pd-prefill", 0, "compare P/D arrangements instead of policies: this many of --replicas prefill, the rest decode (aggregated, disaggregated, conditional; kv routing)")
	pdLink := fs.String("pd-link", "infiniband", "P/D KV transfer link: nvlink, infiniband, roce, tcp")
	pdStall := fs.Float64("pd-stall-weight", 0, "conditional disaggregation: weight of a local prefill's stall of the decode engine's running sequences (0: 1)")
	pdWhole := fs.Duration("pd-whole-max-queue", 0, "conditional disaggregation: a prefill engine with at most this much prefill queued may serve a request whole (0: 1s; negative: never)")
	pdMin := fs.Int("pd-min-remote-tokens", 0, "conditional disaggregation: uncached prompt tokens from which a prefill goes remote (0: 1000; -1: no length threshold)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	loads, err := parseLoads(*loadFlag)
	if err != nil {
		return fmt.Errorf("%w: --load: %v", errUsage, err)
	}
	if strings.TrimSpace(strings.ReplaceAll(*policies, ",", "")) == "" {
		return fmt.Errorf("%w: --policies is empty (known: %s)", errUsage, strings.Join(sim.Policies(), ", "))
	}
	if !(*speed >= 0) {
		return fmt.Errorf("%w: --speed %v: must be positive (0: from --load)", errUsage, *speed)
	}
	switch sim.PipelineMode(*pipeline) {
	case sim.PipelineAuto, sim.PipelineOn, sim.PipelineOff:
	default:
		return fmt.Errorf("%w: --pipeline %q: want auto, on or off", errUsage, *pipeline)
	}
	scales, err := parseFloats(*prefillScale)
	if err != nil {
		return fmt.Errorf("%w: --prefill-scale: %v", errUsage, err)
	}
	cfg := sim.Config{
		PrefillScale:  scales,
		Rates:         *rates,
		Policies:      splitList(*policies),
		Engine:        enginesim.CoreConfig{Profile: *profile, BlockSize: *blockSize, NumGPUBlocks: *gpuBlocks, MaxNumSeqs: *maxSeqs, MaxNumBatchedTokens: *maxBatched},
		EventDelay:    *eventDelay,
		EventLoss:     *eventLoss,
		GaugeInterval: *gaugeInterval,
		SLO:           report.SLO{TTFT: *sloTTFT, ITL: *sloITL},
		Seed:          *seed,
		Parallel:      *parallel,
		Pipeline:      sim.PipelineMode(*pipeline),
		Routers:       *routers,
		Front:         *front,
		NoStripes:     !*stripes,
	}
	if *pdPrefill != 0 {
		cfg.PD = sim.PDConfig{PrefillReplicas: *pdPrefill}
		cfg.PD.Rule.Link, cfg.PD.Rule.MinRemoteTokens, cfg.PD.Rule.StallWeight = *pdLink, *pdMin, *pdStall
		cfg.PD.Rule.WholeMaxQueue = *pdWhole
		if *policies == strings.Join(sim.DefaultPolicies(), ",") {
			cfg.Policies = nil // the arrangements
		}
	}
	if *maxModelLen == 0 && *gpuBlocks > 1 && *blockSize > 0 {
		*maxModelLen = min(enginesim.DefaultMaxModelLen, (*gpuBlocks-1)*(*blockSize))
	}
	cfg.Engine.MaxModelLen = *maxModelLen
	timing, _, err := enginesim.Profile(*profile)
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	extra, err := parseScale(*scale)
	if err != nil {
		return fmt.Errorf("%w: --scale: %v", errUsage, err)
	}
	if err := checkSimSize(*replicas, *requests, extra); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if *routingFile != "" {
		if cfg.Routing, err = loadRoutingConfig(*routingFile); err != nil {
			return err
		}
	}
	var attrs []sim.Attribution // the last run's, with --attribute
	bounds := &sim.BoundMemo{}  // a load sweep over a trace replays the same requests: one bound
	// one simulates the scenario at load (0: its default) and reports it.
	one := func(load float64) (*report.Report, float64, error) {
		opts := sim.ScenarioOptions{Replicas: *replicas, Load: load, Requests: *requests, PrefillRate: timing.PrefillTokensPerSec * mean(scales), Seed: *seed}
		if *scenario == "mooncake" || *scenario == "saturation" {
			if opts.Trace, err = readTrace(*tracePath); err != nil {
				return nil, 0, err
			}
		}
		sc, err := sim.BuildScenario(*scenario, opts)
		if err != nil {
			return nil, 0, fmt.Errorf("%w: %v", errUsage, err)
		}
		if *speed > 0 && sc.Workload.Name == "mooncake" {
			if sc.Workload, err = workload.Mooncake(opts.Trace, workload.MooncakeOptions{Speed: *speed, Limit: *requests}); err != nil {
				return nil, 0, err
			}
			sc.Workload.Params["scenario"] = *scenario
		}
		w := sc.Workload
		if *repeat != 1 {
			if w, err = workload.Repeat(w, *repeat); err != nil {
				return nil, 0, fmt.Errorf("%w: %v", errUsage, err)
			}
		}
		cfg.Replicas = sc.Replicas
		if *dpSize > 1 {
			if sc.Replicas%*dpSize != 0 {
				return nil, 0, fmt.Errorf("%w: --dp-size %d does not divide %d replicas", errUsage, *dpSize, sc.Replicas)
			}
			cfg.Replicas, cfg.DPSize, cfg.DPRankBlind = sc.Replicas / *dpSize, *dpSize, *dpBlind
		}
		cfg.Scale = append(sc.Scale, extra...)
		if cfg.AdapterReplicas = sc.AdapterReplicas; cfg.AdapterReplicas > 0 && !policiesSet(fs) {
			// The oracle does not model adapters: the default list without it.
			cfg.Policies = slices.DeleteFunc(cfg.Policies, func(p string) bool { return p == sim.PolicyOracle })
		}
		start := time.Now()
		runs, bound, at, err := simulate(ctx, cfg, w, *pooled, *attribute, bounds)
		if err != nil {
			return nil, 0, err
		}
		attrs = at
		title := fmt.Sprintf("kvrouter sim: %s, %d replicas, load %.2g", *scenario, *replicas, sc.Load)
		rep := report.New(title, w.Info(), runs, cfg.SLO)
		rep.HitRateBound = sim.HitRateBound(w, *blockSize)
		if bound != nil {
			rep.SetPooledBound(report.PooledBound{HitRate: bound.HitRate, CachedTokens: bound.CachedTokens, GPUBlocks: bound.GPUBlocks, CPUBlocks: bound.CPUBlocks})
		}
		rep.Setup = map[string]string{
			"replicas": strconv.Itoa(*replicas), "start_replicas": strconv.Itoa(sc.Replicas), "profile": *profile,
			"block_size": strconv.Itoa(*blockSize), "event_delay": eventDelay.String(), "event_loss": fmt.Sprint(*eventLoss),
			"seed": fmt.Sprint(*seed), "wall_time": time.Since(start).Round(time.Millisecond).String(),
		}
		if len(scales) > 0 {
			rep.Setup["prefill_scale"], rep.Setup["rates"] = *prefillScale, *rates
		}
		if *routers > 1 {
			rep.Setup["routers"], rep.Setup["front"] = strconv.Itoa(*routers), *front
			rep.Setup["stripes"] = strconv.FormatBool(*stripes)
		}
		if *dpSize > 1 {
			rep.Setup["dp_size"], rep.Setup["dp_rank_blind"] = strconv.Itoa(*dpSize), strconv.FormatBool(*dpBlind)
		}
		for _, s := range cfg.Scale {
			rep.Setup["scale"] += fmt.Sprintf("%v:%+d ", s.At.Round(time.Second), s.Delta)
		}
		return rep, sc.Load, nil
	}
	var rep *report.Report
	var sweep []report.SweepPoint
	for _, load := range loads {
		r, used, err := one(load)
		if err != nil {
			return err
		}
		if len(loads) > 1 {
			r.Sweep = sweep
			r.AddSweep(used, r)
			sweep = r.Sweep
		}
		rep = r
	}
	if *pdPrefill != 0 {
		rep.Setup["pd_prefill"], rep.Setup["pd_link"] = strconv.Itoa(*pdPrefill), *pdLink
	}
	if err := writeReport(rep, *asJSON, *htmlPath, sio); err != nil {
		return err
	}
	if *attribute && !*asJSON {
		fmt.Fprintf(sio.out, "\nCached tokens lost against the pooled-cache bound, as shares of its cached tokens:\n\n%s", sim.AttributionMarkdown(attrs))
	}
	if *pdPrefill != 0 && !*asJSON {
		fmt.Fprintln(sio.out, sim.PDVerdict(rep.Policies))
	}
	return nil
}

// parseLoads reads --load: one value (0: the scenario's default) or a
// comma-separated list of positive loads to sweep.
func parseLoads(s string) ([]float64, error) {
	var out []float64
	for _, part := range splitList(s) {
		v, err := strconv.ParseFloat(part, 64)
		if err != nil || v < 0 || math.IsInf(v, 0) || math.IsNaN(v) {
			return nil, fmt.Errorf("%q: want a non-negative number", part)
		}
		out = append(out, v)
	}
	if len(out) == 0 {
		return []float64{0}, nil
	}
	if len(out) > 1 {
		for _, v := range out {
			if v == 0 {
				return nil, fmt.Errorf("a sweep needs positive loads, got %s", s)
			}
		}
	}
	return out, nil
}

// simulate runs cfg's policies on w and, when pooled, the pooled-cache
// bound (from bounds when it holds w's) on its own goroutine beside them
// (nil bound otherwise); attribute
// runs sim.Attribute instead (bound, then policies, and the attribution).
func simulate(ctx context.Context, cfg sim.Config, w *workload.Workload, pooled, attribute bool, bounds *sim.BoundMemo) ([]*report.Run, *sim.Bound, []sim.Attribution, error) {
	if attribute {
		runs, attrs, b, err := sim.Attribute(ctx, cfg, w)
		if err != nil {
			return nil, nil, nil, err
		}
		return runs, &b, attrs, nil
	}
	if !pooled {
		runs, err := sim.Run(ctx, cfg, w)
		return runs, nil, nil, err
	}
	type result struct {
		b   sim.Bound
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
	runs, err := sim.Run(ctx, cfg, w)
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

func defaultLoads() string {
	var parts []string
	for _, s := range sim.Scenarios() {
		parts = append(parts, fmt.Sprintf("%s %.2g", s.Name, sim.DefaultLoad(s.Name)))
	}
	return strings.Join(parts, ", ")
}

func scenarioList() string {
	var b strings.Builder
	for _, s := range sim.Scenarios() {
		fmt.Fprintf(&b, "  %-14s %s\n", s.Name, s.Description)
	}
	return b.String()
}

// writeReport prints rep as markdown (or JSON) on out and, when htmlPath is
// set, writes the HTML page there.
func writeReport(rep *report.Report, asJSON bool, htmlPath string, sio stdio) error {
	if htmlPath != "" {
		abs, err := filepath.Abs(htmlPath)
		if err != nil {
			return fmt.Errorf("html report: %w", err)
		}
		f, err := os.Create(abs)
		if err != nil {
			return fmt.Errorf("html report: %w", err)
		}
		err = rep.HTML(f)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("html report: %w", err)
		}
		fmt.Fprintf(sio.err, "HTML report written to %s\n", abs)
	}
	if asJSON {
		return rep.JSON(sio.out)
	}
	return rep.Markdown(sio.out)
}

// readTrace reads a Mooncake trace from path, or the embedded one.
func readTrace(path string) ([]workload.TraceRecord, error) {
	var r io.ReadCloser
	var err error
	if path == "" {
		r, err = kvrouter.Assets.Open(embeddedTrace)
	} else {
		r, err = os.Open(path)
	}
	if err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	defer r.Close()
	return workload.ReadTrace(r)
}

// loadRoutingConfig reads routing weights from a YAML file, rejecting
// unknown fields.
func loadRoutingConfig(path string) (routing.Config, error) {
	var cfg routing.Config
	f, err := os.Open(path)
	if err != nil {
		return cfg, fmt.Errorf("routing config: %w", err)
	}
	defer f.Close()
	dec := yaml.NewDecoder(f)
	dec.KnownFields(true)
	if err := dec.Decode(&cfg); err != nil && !errors.Is(err, io.EOF) {
		return cfg, fmt.Errorf("routing config %s: %w", path, err)
	}
	return cfg, nil
}

// parseScale parses "TIME:DELTA,..." (e.g. "120s:+4,300s:-2").
func parseScale(s string) ([]sim.Scale, error) {
	var out []sim.Scale
	for _, part := range splitList(s) {
		at, delta, ok := strings.Cut(part, ":")
		if !ok {
			return nil, fmt.Errorf("%q: want TIME:DELTA", part)
		}
		d, err := time.ParseDuration(at)
		if err != nil {
			return nil, fmt.Errorf("%q: %v", part, err)
		}
		n, err := strconv.Atoi(strings.TrimPrefix(delta, "+"))
		if err != nil || n == 0 {
			return nil, fmt.Errorf("%q: delta must be a non-zero integer", part)
		}
		out = append(out, sim.Scale{At: d, Delta: n})
	}
	return out, nil
}

// maxSimReplicas bounds the simulated fleet at any moment: each replica is a
// whole engine core with its own prefix cache (about 1 MB of index tables
// and its block pool), so an unbounded --scale could exhaust memory.
const maxSimReplicas = 1024

// checkSimSize rejects fleet sizes and request counts the simulator cannot
// run: --replicas outside 1..maxSimReplicas, a negative --requests, or
// --scale steps that take the fleet above maxSimReplicas or below 1 at any
// time.
func checkSimSize(replicas, requests int, scale []sim.Scale) error {
	if replicas < 1 || replicas > maxSimReplicas {
		return fmt.Errorf("--replicas %d: want 1..%d", replicas, maxSimReplicas)
	}
	if requests < 0 {
		return fmt.Errorf("--requests %d: must not be negative", requests)
	}
	steps := slices.Clone(scale)
	slices.SortStableFunc(steps, func(a, b sim.Scale) int { return cmp.Compare(a.At, b.At) })
	n := replicas
	for _, st := range steps {
		if n += st.Delta; n > maxSimReplicas {
			return fmt.Errorf("--scale: %v:%+d makes %d replicas, more than %d", st.At, st.Delta, n, maxSimReplicas)
		}
		if n < 1 {
			return fmt.Errorf("--scale: %v:%+d leaves %d replicas, need at least 1", st.At, st.Delta, n)
		}
	}
	return nil
}

// splitList splits a comma-separated flag value, dropping empty items.
func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// parseFloats parses a comma-separated list of positive numbers ("" is
// none).
func parseFloats(s string) ([]float64, error) {
	var out []float64
	for _, f := range splitList(s) {
		x, err := strconv.ParseFloat(f, 64)
		if err != nil || !(x > 0) || math.IsInf(x, 0) {
			return nil, fmt.Errorf("%q: want a positive number", f)
		}
		out = append(out, x)
	}
	return out, nil
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

// policiesSet reports whether --policies was given.
func policiesSet(fs *flag.FlagSet) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == "policies" })
	return set
}
