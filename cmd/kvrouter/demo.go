package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"kvrouter/internal/bench"
	"kvrouter/internal/bench/report"
	"kvrouter/internal/config"
	"kvrouter/internal/enginesim"
	"kvrouter/internal/sim"
	"kvrouter/internal/workload"
)

// demoEngine is one engine-sim started by the demo.
type demoEngine struct {
	Name   string
	URL    string // http://127.0.0.1:PORT
	Events string // KV event PUB endpoint, tcp://127.0.0.1:PORT
	Replay string // replay ROUTER endpoint
	// srv is the engine-sim, for its timing lag (nil for engines not
	// started by the demo).
	srv *enginesim.Server
}

// routerFactory starts a kvrouter in this process, routing among engines
// with policy, and returns its base URL and a stop function that returns
// once it has shut down.
type routerFactory func(ctx context.Context, policy string, engines []demoEngine, log *slog.Logger) (url string, stop func() error, err error)

// startRouter runs the server "kvrouter serve" runs, configured in its
// quick form: one model, the engines with their KV event and replay
// endpoints, token-id prompts (tokenizer none), the policy.
var startRouter routerFactory = func(ctx context.Context, policy string, engines []demoEngine, log *slog.Logger) (string, func() error, error) {
	m := config.Model{Name: demoModel, Tokenizer: config.TokenizerNone, Policy: policy}
	for _, e := range engines {
		m.Engines = append(m.Engines, config.Engine{Name: e.Name, URL: e.URL, Events: e.Events, Replay: e.Replay})
	}
	cfg := config.Config{Models: []config.Model{m}}
	cfg.FillDefaults(func(string) string { return "" })
	if err := cfg.Validate(); err != nil {
		return "", nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	url := "http://" + ln.Addr().String()
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- recovered("router", func() error { return serve(ctx, &serveFlags{cfg: cfg}, ln, log) })()
	}()
	stop := func() error { cancel(); return <-done }
	// /ready?full=1: every engine probed and its event stream connected.
	if err := waitReady(ctx, url+"/ready?full=1", done); err != nil {
		return "", nil, errors.Join(err, stop())
	}
	return url, stop, nil
}

// waitReady polls url until it answers 200 (every engine probed, every
// event subscriber connected), the server stops, or 30 s pass.
func waitReady(ctx context.Context, url string, done <-chan error) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case err := <-done:
			return fmt.Errorf("kvrouter stopped before it was ready: %v", err)
		case <-ctx.Done():
			return fmt.Errorf("kvrouter not ready: %w", ctx.Err())
		case <-tick.C:
		}
	}
}

// demoModel is the model name the demo's engines serve.
const demoModel = "demo-model"

// demoTiming is enginesim's H100 profile made 10x faster, so that the
// trace can be compressed 10x in time while queues, batching and cache
// effects keep their proportions.
func demoTiming() enginesim.Timing {
	t, _, _ := enginesim.Profile(enginesim.ProfileH100)
	t.StepOverhead /= 10
	t.DecodePerSeq /= 10
	t.PrefillTokensPerSec *= 10
	t.CPULoadTokensPerSec *= 10
	return t
}

// runDemo implements "kvrouter demo": 4 engine-sims and a kvrouter on
// loopback, a time-compressed slice of the embedded Mooncake trace replayed
// once per policy from cold caches, then the comparison table and an HTML
// report.
func runDemo(ctx context.Context, args []string, sio stdio) error {
	fs := newFlagSet("demo", "[flags]\n\nStarts 4 engine-sims (HTTP and ZeroMQ KV events on loopback) and a kvrouter per\npolicy in this process, replays a time-compressed slice of the embedded Mooncake\nconversation trace through each, prints the comparison and writes an HTML report.", sio.err)
	policies := fs.String("policies", "round_robin,kv", "comma-separated router policies to compare, each from cold engines (kvrouter's policies, e.g. round_robin, least_load, kv, dynamo, llmd, sglang)")
	engines := fs.Int("engines", 4, "engine-sims to start")
	requests := fs.Int("requests", 500, "Mooncake records to replay")
	skip := fs.Int("skip", 1000, "Mooncake records to skip first (the default slice has more reuse within the engines' reach than the trace's start)")
	speed := fs.Float64("speed", 0, "trace time compression (0: 10 x --engines / 4, matching the engines' 10x faster timing)")
	blocks := fs.Int("num-gpu-blocks", 27000, "engine KV cache size in 16-token blocks (27000: the h100 profile's)")
	maxOut := fs.Int("max-output-tokens", 128, "cap on output lengths (keeps the stream volume within the time budget)")
	htmlPath := fs.String("html", "kvrouter-demo.html", "HTML report file (empty: none)")
	asJSON := fs.Bool("json", false, "print the report as JSON instead of a markdown table")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *engines < 1 || *requests < 1 {
		return fmt.Errorf("%w: need at least one engine and one request", errUsage)
	}
	if *speed == 0 {
		*speed = 10 * float64(*engines) / 4
	}
	recs, err := readTrace("")
	if err != nil {
		return err
	}
	// Prompts longer than the engines' context are cut to fit, as a client
	// would have to.
	maxIn := demoMaxModelLen(*blocks) - *maxOut
	if maxIn < 1 || *maxOut < 1 {
		return fmt.Errorf("%w: --num-gpu-blocks %d too small for --max-output-tokens %d", errUsage, *blocks, *maxOut)
	}
	w, err := workload.Mooncake(recs, workload.MooncakeOptions{Speed: *speed, Skip: *skip, Limit: *requests, MaxInputTokens: maxIn, MaxOutputTokens: *maxOut})
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(sio.err, &slog.HandlerOptions{Level: slog.LevelWarn}))
	fmt.Fprintf(sio.err, "demo: %d engine-sims, %d Mooncake requests over %.0f s, policies %s\n", *engines, len(w.Requests), w.Info().DurationS, *policies)
	var runs []*report.Run
	var paces []demoPace
	for _, p := range splitList(*policies) {
		pace, err := demoRun(ctx, p, *engines, *blocks, w, sio, log)
		if err != nil {
			return fmt.Errorf("policy %s: %w", p, err)
		}
		runs = append(runs, pace.run)
		paces = append(paces, pace)
	}
	rep := report.New(fmt.Sprintf("kvrouter demo: Mooncake slice, %d engine-sims", *engines), w.Info(), runs,
		report.SLO{TTFT: 2 * time.Second / 10, ITL: 100 * time.Millisecond / 10})
	rep.Setup = map[string]string{"engines": fmt.Sprint(*engines), "timing": "h100-llama3-8b x10", "speed": fmt.Sprint(*speed), "num_gpu_blocks": fmt.Sprint(*blocks)}
	if err := setPooledBounds(ctx, rep, w, *engines, *blocks); err != nil {
		return err
	}
	if err := writeReport(rep, *asJSON, *htmlPath, sio); err != nil {
		return err
	}
	warnBehind(sio.err, paces, *speed)
	return nil
}

// demoPace is one policy's run and how far its engines fell behind their
// timing model: lag is the clock time their steps took beyond the modelled
// duration, summed over the engines.
type demoPace struct {
	run           *report.Run
	lag, modelled time.Duration
}

// enginesBehind reports whether the engines' steps took more than a quarter
// longer than modelled: the machine could not run them at the trace's pace.
// Below that is the ordinary cost of sub-millisecond steps (Go timers fire
// some tens of microseconds late, and the step itself computes).
func (p demoPace) enginesBehind() bool { return p.modelled > 0 && p.lag*4 > p.modelled }

// warnBehind says, for each run whose replay or engines fell behind the
// trace, that this machine could not keep pace, so its row measures the
// machine's load more than the policy and need not agree with the
// published results.
func warnBehind(w io.Writer, paces []demoPace, speed float64) {
	behind := false
	for _, p := range paces {
		r := p.run
		if r.FellBehind() {
			behind = true
			fmt.Fprintf(w, "demo: %s: this machine could not keep pace with the trace: %d of %d requests were sent more than %v late (up to %v)\n",
				r.Policy, r.LateSends, len(r.Samples), report.LateAfter, r.MaxLateness.Round(time.Millisecond))
		}
		if p.enginesBehind() {
			behind = true
			fmt.Fprintf(w, "demo: %s: this machine could not keep pace with the trace: the engines' steps took %.0f%% longer than their timing model (%v beyond %v)\n",
				r.Policy, 100*float64(p.lag)/float64(p.modelled), p.lag.Round(time.Millisecond), p.modelled.Round(time.Millisecond))
		}
	}
	if behind {
		fmt.Fprintf(w, "demo: the replay fell behind, so the table above reflects this machine's load, not only the policies; run it on a quieter machine or slow the trace (--speed %g)\n", speed/2)
	}
}

// setPooledBounds adds the replayed workload's hit-rate bound and
// pooled-cache bound to rep, as `kvrouter sim` computes them: sim.PooledBound
// over the same requests with the engines' block capacity (n engines of
// blocks GPU blocks of enginesim.DefaultBlockSize tokens, context length
// demoMaxModelLen(blocks)), so a live hit rate reads as a share of what the
// fleet's cache could hold (demo and bench --bound-blocks).
func setPooledBounds(ctx context.Context, rep *report.Report, w *workload.Workload, n, blocks int) error {
	rep.HitRateBound = sim.HitRateBound(w, enginesim.DefaultBlockSize)
	b, err := sim.PooledBound(ctx, sim.Config{Replicas: n, Engine: enginesim.CoreConfig{NumGPUBlocks: blocks, MaxModelLen: demoMaxModelLen(blocks)}}, w)
	if err != nil {
		return err
	}
	rep.SetPooledBound(report.PooledBound{HitRate: b.HitRate, CachedTokens: b.CachedTokens, GPUBlocks: b.GPUBlocks, CPUBlocks: b.CPUBlocks})
	return nil
}

// demoRun starts cold engines and a kvrouter with policy in front of them,
// replays w through the router and stops everything.
func demoRun(ctx context.Context, policy string, n, blocks int, w *workload.Workload, sio stdio, log *slog.Logger) (demoPace, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	g, gctx := errgroup.WithContext(ctx)
	engines := make([]demoEngine, n)
	for i := range engines {
		e, err := startDemoEngine(gctx, g, i, blocks, log)
		if err != nil {
			cancel()
			return demoPace{}, errors.Join(err, g.Wait())
		}
		engines[i] = e
	}
	var urls []string
	for _, e := range engines {
		urls = append(urls, e.URL)
	}
	url, stop, err := startRouter(gctx, policy, engines, log)
	if err != nil {
		cancel()
		return demoPace{}, errors.Join(err, g.Wait())
	}
	cfg := bench.Config{Name: policy, Model: demoModel, Targets: []string{url}, Policy: bench.PolicyRouter, Metrics: urls, Timeout: 2 * time.Minute}
	if bench.IsTerminal(sio.err) {
		cfg.Progress = sio.err
	}
	run, err := bench.Run(gctx, cfg, w, nil, log)
	pace := demoPace{run: run}
	for _, e := range engines {
		lag, modelled := e.srv.TimingLag()
		pace.lag += lag
		pace.modelled += modelled
	}
	if stop != nil {
		err = errors.Join(err, stop())
	}
	cancel()
	return pace, errors.Join(err, g.Wait())
}

// startDemoEngine starts engine-sim i on a loopback port with KV events
// and replay, and waits until its sockets are up.
func startDemoEngine(ctx context.Context, g *errgroup.Group, i, blocks int, log *slog.Logger) (demoEngine, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return demoEngine{}, fmt.Errorf("engine %d: %w", i, err)
	}
	srv, err := enginesim.New(enginesim.Config{
		Core:            enginesim.CoreConfig{NumGPUBlocks: blocks, MaxModelLen: demoMaxModelLen(blocks), Timing: demoTiming()},
		ServedModelName: demoModel,
		KVEvents: enginesim.KVEventsConfig{EnableKVCacheEvents: true,
			Endpoint: "tcp://127.0.0.1:0", Bind: true, ReplayEndpoint: "tcp://127.0.0.1:0"}, // loopback only
	}, log.With("engine", i), prometheus.NewRegistry())
	if err != nil {
		ln.Close()
		return demoEngine{}, fmt.Errorf("engine %d: %w", i, err)
	}
	g.Go(recovered(fmt.Sprintf("engine %d", i), func() error { return srv.Serve(ctx, ln) }))
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	pub, replay, err := srv.KVEventsAddrs(wctx)
	if err != nil {
		return demoEngine{}, fmt.Errorf("engine %d: kv events: %w", i, err)
	}
	return demoEngine{
		Name:   fmt.Sprintf("engine-%d", i),
		URL:    "http://" + ln.Addr().String(),
		Events: loopback(pub),
		Replay: loopback(replay),
		srv:    srv,
	}, nil
}

// demoMaxModelLen is the longest sequence an engine with blocks GPU blocks
// accepts: what its cache holds (one block is vLLM's null block).
func demoMaxModelLen(blocks int) int {
	return min(enginesim.DefaultMaxModelLen, (blocks-1)*enginesim.DefaultBlockSize)
}

// loopback rewrites a wildcard bound address to 127.0.0.1.
func loopback(addr string) string {
	for _, wild := range []string{"0.0.0.0", "[::]", "*"} {
		addr = strings.Replace(addr, wild, "127.0.0.1", 1)
	}
	if addr != "" && !strings.Contains(addr, "://") {
		addr = "tcp://" + addr
	}
	return addr
}
