package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"

	"kvrouter"
	"kvrouter/internal/bench/report"
	"kvrouter/internal/enginesim"
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
	draw := fs.Uint64("draw", 0, "rerun the seed's arrivals with other tie-breaks, event loss and conversation ids (0: the seed's own run)")
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
	loads, err := sim.ParseLoads(*loadFlag)
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
		Draw:          *draw,
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
	if _, _, err := enginesim.Profile(*profile); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	extra, err := sim.ParseScale(*scale)
	if err != nil {
		return fmt.Errorf("%w: --scale: %v", errUsage, err)
	}
	if err := sim.CheckSize(*replicas, *requests, extra); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if *routingFile != "" {
		if cfg.Routing, err = sim.LoadRoutingConfig(*routingFile); err != nil {
			return err
		}
	}
	study := sim.Study{Scenario: *scenario, Replicas: *replicas, Requests: *requests, Repeat: *repeat, Loads: loads, Speed: *speed,
		Scale: extra, DPSize: *dpSize, DPRankBlind: *dpBlind, Pooled: *pooled, Attribute: *attribute, PoliciesSet: policiesSet(fs),
		PrefillScaleText: *prefillScale, Sim: cfg}
	if *scenario == "mooncake" || *scenario == "saturation" {
		if study.Trace, err = readTrace(*tracePath); err != nil {
			return err
		}
	}
	rep, attrs, err := sim.Compare(ctx, study)
	if err != nil {
		return err
	}
	if err := rep.Write(sio.out, sio.err, *asJSON, *htmlPath); err != nil {
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

// policiesSet reports whether --policies was given.
func policiesSet(fs *flag.FlagSet) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == "policies" })
	return set
}
