// Package demo is "kvrouter demo": engine-sims with KV events and a
// kvrouter per policy, all in this process on loopback, a time-compressed
// slice of the Mooncake trace replayed through each from cold caches, and
// the comparison. The engines run enginesim's H100 timing made 10x faster
// so the trace can be compressed 10x in time with queues, batching and
// cache effects in proportion; the report says when this machine could
// not keep pace. Run starts every goroutine it needs and returns once they
// have stopped.
package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime/debug"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"kvrouter/internal/bench"
	"kvrouter/internal/bench/report"
	"kvrouter/internal/config"
	"kvrouter/internal/enginesim"
	"kvrouter/internal/serve"
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

// startRouter runs the server "kvrouter serve" runs (internal/serve),
// configured in its quick form: one model, the engines with their KV event
// and replay endpoints, token-id prompts (tokenizer none), the policy. It
// returns the router's base URL and a stop function that returns once it
// has shut down.
func startRouter(ctx context.Context, policy string, engines []demoEngine, log *slog.Logger) (string, func() error, error) {
	m := config.Model{Name: demoModel, Tokenizer: config.TokenizerNone, Policy: policy}
	for _, e := range engines {
		m.Engines = append(m.Engines, config.Engine{Name: e.Name, URL: e.URL, Events: e.Events, Replay: e.Replay})
	}
	cfg := config.Config{Models: []config.Model{m}}
	cfg.FillDefaults(func(string) string { return "" })
	if err := cfg.Validate(); err != nil {
		return "", nil, err
	}
	app, err := serve.New(ctx, serve.Options{Config: cfg, Log: log})
	if err != nil {
		return "", nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		app.Close()
		return "", nil, err
	}
	url := "http://" + ln.Addr().String()
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- recovered("router", func() error { return app.Run(ctx, ln) })()
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

// Config is one demo run.
type Config struct {
	// Policies are the router policies compared, each from cold engines.
	Policies []string
	// Engines is the number of engine-sims; Blocks each one's KV cache in
	// 16-token blocks.
	Engines, Blocks int
	// Trace is the Mooncake trace; Skip records are skipped, then Requests
	// replayed, their inter-arrival times divided by Speed (0: 10 x
	// Engines / 4, matching the engines' 10x faster timing) and their
	// outputs capped at MaxOutput tokens.
	Trace          []workload.TraceRecord
	Skip, Requests int
	Speed          float64
	MaxOutput      int
	JSON           bool   // print the report as JSON, not markdown
	HTML           string // HTML report file ("": none)
}

// Run starts cfg.Engines engine-sims and a kvrouter per policy on
// loopback, replays a time-compressed slice of cfg.Trace through each
// from cold caches, prints the comparison on out, writes the HTML report
// and says on errw which runs fell behind the trace. An error wrapping
// ErrConfig is the caller's mistake.
func Run(ctx context.Context, cfg Config, out, errw io.Writer) error {
	if cfg.Engines < 1 || cfg.Requests < 1 {
		return fmt.Errorf("%w: need at least one engine and one request", ErrConfig)
	}
	speed := cfg.Speed
	if speed == 0 {
		speed = 10 * float64(cfg.Engines) / 4
	}
	// Prompts longer than the engines' context are cut to fit, as a client
	// would have to.
	maxIn := sim.MaxModelLen(cfg.Blocks) - cfg.MaxOutput
	if maxIn < 1 || cfg.MaxOutput < 1 {
		return fmt.Errorf("%w: --num-gpu-blocks %d too small for --max-output-tokens %d", ErrConfig, cfg.Blocks, cfg.MaxOutput)
	}
	w, err := workload.Mooncake(cfg.Trace, workload.MooncakeOptions{Speed: speed, Skip: cfg.Skip, Limit: cfg.Requests, MaxInputTokens: maxIn, MaxOutputTokens: cfg.MaxOutput})
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(errw, &slog.HandlerOptions{Level: slog.LevelWarn}))
	fmt.Fprintf(errw, "demo: %d engine-sims, %d Mooncake requests over %.0f s, policies %s\n", cfg.Engines, len(w.Requests), w.Info().DurationS, strings.Join(cfg.Policies, ","))
	var runs []*report.Run
	var paces []demoPace
	for _, p := range cfg.Policies {
		pace, err := demoRun(ctx, p, cfg.Engines, cfg.Blocks, w, errw, log)
		if err != nil {
			return fmt.Errorf("policy %s: %w", p, err)
		}
		runs = append(runs, pace.run)
		paces = append(paces, pace)
	}
	rep := report.New(fmt.Sprintf("kvrouter demo: Mooncake slice, %d engine-sims", cfg.Engines), w.Info(), runs,
		report.SLO{TTFT: 2 * time.Second / 10, ITL: 100 * time.Millisecond / 10})
	rep.Setup = map[string]string{"engines": fmt.Sprint(cfg.Engines), "timing": "h100-llama3-8b x10", "speed": fmt.Sprint(speed), "num_gpu_blocks": fmt.Sprint(cfg.Blocks)}
	if err := sim.SetLiveBounds(ctx, rep, w, cfg.Engines, cfg.Blocks); err != nil {
		return err
	}
	if err := rep.Write(out, errw, cfg.JSON, cfg.HTML); err != nil {
		return err
	}
	warnBehind(errw, paces, speed)
	return nil
}

// ErrConfig marks a Config Run cannot run (a usage error of the command).
var ErrConfig = errors.New("usage")

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

// demoRun starts cold engines and a kvrouter with policy in front of them,
// replays w through the router and stops everything.
func demoRun(ctx context.Context, policy string, n, blocks int, w *workload.Workload, errw io.Writer, log *slog.Logger) (demoPace, error) {
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
	if bench.IsTerminal(errw) {
		cfg.Progress = errw
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
		Core:            enginesim.CoreConfig{NumGPUBlocks: blocks, MaxModelLen: sim.MaxModelLen(blocks), Timing: demoTiming()},
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

// recovered wraps a goroutine's body so that a panic in it comes back as an
// error naming what panicked, with its stack (style: no panic crosses a
// goroutine boundary).
func recovered(what string, f func() error) func() error {
	return func() (err error) {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("%s panicked: %v\n%s", what, r, debug.Stack())
			}
		}()
		return f()
	}
}
