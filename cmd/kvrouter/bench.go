package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"kvrouter/internal/bench"
	"kvrouter/internal/bench/report"
	"kvrouter/internal/sim"
	"kvrouter/internal/workload"
)

// workloadFlags are bench's workload options (workload.Spec) and the
// trace file.
type workloadFlags struct {
	workload.Spec
	trace string
}

// build reads the trace (mooncake) and makes the requests.
func (o *workloadFlags) build() (*workload.Workload, error) {
	var recs []workload.TraceRecord
	if o.Kind == "mooncake" {
		var err error
		if recs, err = readTrace(o.trace); err != nil {
			return nil, err
		}
	}
	w, err := o.Spec.Build(recs)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errUsage, err)
	}
	return w, nil
}

func (o *workloadFlags) register(fs interface {
	StringVar(*string, string, string, string)
	IntVar(*int, string, int, string)
	Float64Var(*float64, string, float64, string)
	Uint64Var(*uint64, string, uint64, string)
}, defRequests int, defSpeed float64) {
	fs.StringVar(&o.Kind, "workload", "mooncake", "requests to replay: "+strings.Join(workload.Kinds(), ", "))
	fs.StringVar(&o.trace, "trace", "", "mooncake: trace file, JSON lines or gzip, Mooncake or Qwen-Bailian lines; sessions sent as x-session-id (default: the Mooncake conversation trace embedded in the binary)")
	fs.IntVar(&o.Requests, "requests", defRequests, "mooncake: replay this many records (0: all); synthetic workloads: number of requests (0: 200; shared_prefix rounds down to a multiple of --groups, multi_turn to whole 6-turn conversations)")
	fs.IntVar(&o.Skip, "skip", 0, "mooncake: skip this many records first")
	fs.Float64Var(&o.Speed, "speed", defSpeed, "mooncake: divide the trace's inter-arrival times by this")
	fs.Float64Var(&o.Rate, "rate", 0, "Poisson arrivals at this many requests/s (synthetic workloads: default 10; mooncake: replaces the trace's timestamps)")
	fs.IntVar(&o.MaxInput, "max-input-tokens", 0, "mooncake: truncate prompts to this many tokens (0: keep)")
	fs.IntVar(&o.MaxOutput, "max-output-tokens", 0, "mooncake: cap output lengths (0: keep)")
	fs.IntVar(&o.PromptTokens, "prompt-tokens", 2048, "unique: prompt length in tokens")
	fs.IntVar(&o.PrefixTokens, "prefix-tokens", 2048, "hot_prefix, shared_prefix, multi_turn: shared prefix (system prompt) length in tokens")
	fs.IntVar(&o.SuffixTokens, "suffix-tokens", 256, "hot_prefix, shared_prefix, multi_turn: per-request suffix (question, user turn) length in tokens")
	fs.IntVar(&o.OutputTokens, "output-tokens", 128, "synthetic workloads: output length in tokens")
	fs.IntVar(&o.Groups, "groups", 16, "shared_prefix: number of prefix groups")
	fs.Float64Var(&o.HotShare, "hot-share", 0.8, "hot_prefix: share of requests with the hot prefix (0..1)")
	fs.Uint64Var(&o.Seed, "seed", 1, "random seed (generators, Poisson arrivals, random policy)")
}

// runBench implements "kvrouter bench": replay a workload open-loop against
// a kvrouter (--router) or against engines with client-side policies
// (--engines, --policies), and print the comparison.
func runBench(ctx context.Context, args []string, sio stdio) error {
	fs := newFlagSet("bench", "(--router URL | --engines URL,URL,...) [flags]\n\nReplays a workload open-loop against live servers over HTTP (streaming\n/v1/completions with token-id prompts) and prints TTFT, ITL, hit rate and\ngoodput per run. With --router, one run through a kvrouter (the replica is read\nfrom x-kvrouter-replica); with --engines, one run per client-side policy.", sio.err)
	var wf workloadFlags
	wf.register(fs, 0, 1)
	router := fs.String("router", "", "base URL of a kvrouter (or any OpenAI server) to send every request to; comma-separated: one run per URL, in order (e.g. one router, then a balancer in front of several)")
	name := fs.String("name", "router", "with --router: the run's name in the report (e.g. the router's policy); comma-separated, one per --router URL")
	engines := fs.String("engines", "", "comma-separated engine base URLs; requests are spread by --policies on the client side")
	policies := fs.String("policies", bench.PolicyRoundRobin, "with --engines: comma-separated client-side policies, one run each: round_robin, least_load, random")
	metrics := fs.String("metrics", "", "comma-separated engine base URLs whose /metrics give the engines' own hit rate and preemptions (default: --engines)")
	reset := fs.Bool("reset", false, "POST /reset_prefix_cache to the --metrics engines before each run (vLLM needs VLLM_SERVER_DEV_MODE=1)")
	model := fs.String("model", "", "model name to send (default: the first of the target's /v1/models)")
	timeout := fs.Duration("timeout", 10*time.Minute, "per-request timeout")
	maxInFlight := fs.Int("max-inflight", 4096, "concurrent request cap; requests due beyond it fail as \"overload\" (open loop)")
	sloTTFT := fs.Duration("slo-ttft", 2*time.Second, "goodput SLO on time to first token")
	sloITL := fs.Duration("slo-itl", 100*time.Millisecond, "goodput SLO on mean time per output token after the first")
	asJSON := fs.Bool("json", false, "print the report as JSON instead of a markdown table")
	htmlPath := fs.String("html", "", "also write a self-contained HTML report with plots to this file")
	noProgress := fs.Bool("no-progress", false, "no progress bar (it is drawn only when stderr is a terminal anyway)")
	boundBlocks := fs.Int("bound-blocks", 0, "each engine's num_gpu_blocks (16-token blocks): also report the workload's pooled-cache bound for --bound-engines such engines, as kvrouter sim does, and each run's share of it (0: none)")
	boundEngines := fs.Int("bound-engines", 0, "with --bound-blocks: the engines behind the target (0: the --metrics engines, else the --engines)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if (*router == "") == (*engines == "") {
		return fmt.Errorf("%w: give exactly one of --router and --engines", errUsage)
	}
	if *boundBlocks < 0 || *boundEngines < 0 || (*boundBlocks > 0 && *boundEngines == 0 && *metrics == "" && *engines == "") {
		return fmt.Errorf("%w: --bound-blocks needs a positive block count and, with --router, --bound-engines or --metrics", errUsage)
	}
	w, err := wf.build()
	if err != nil {
		return err
	}
	base := bench.Config{Model: *model, Timeout: *timeout, MaxInFlight: *maxInFlight, Reset: *reset, Seed: wf.Seed}
	if *metrics != "" {
		base.Metrics = splitList(*metrics)
	}
	if !*noProgress && bench.IsTerminal(sio.err) {
		base.Progress = sio.err
	}
	var cfgs []bench.Config
	if *router != "" {
		urls, names := splitList(*router), splitList(*name)
		if len(urls) > 1 && len(names) != len(urls) {
			return fmt.Errorf("%w: %d --router URLs need as many comma-separated --name values, got %d", errUsage, len(urls), len(names))
		}
		for i, u := range urls {
			c := base
			c.Name, c.Targets, c.Policy = *name, []string{u}, bench.PolicyRouter
			if len(urls) > 1 {
				c.Name = names[i]
			}
			cfgs = append(cfgs, c)
		}
	} else {
		for _, p := range splitList(*policies) {
			c := base
			c.Name, c.Targets, c.Policy = p, splitList(*engines), p
			cfgs = append(cfgs, c)
		}
	}
	log := slog.New(slog.NewTextHandler(sio.err, &slog.HandlerOptions{Level: slog.LevelWarn}))
	runs, err := bench.RunAll(ctx, cfgs, w, log)
	if err != nil {
		return err
	}
	rep := report.New("kvrouter bench: "+w.Name, w.Info(), runs, report.SLO{TTFT: *sloTTFT, ITL: *sloITL})
	if *boundBlocks > 0 {
		n := *boundEngines
		if n == 0 {
			n = len(base.Metrics)
		}
		if n == 0 {
			n = len(splitList(*engines))
		}
		if err := sim.SetLiveBounds(ctx, rep, w, n, *boundBlocks); err != nil {
			return err
		}
	}
	return rep.Write(sio.out, sio.err, *asJSON, *htmlPath)
}
