package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"time"

	"kvrouter/internal/bench/report"
	"kvrouter/internal/workload"
)

// Client-side policies for direct mode. PolicyRouter means the single
// target chooses (a kvrouter).
const (
	PolicyRouter     = "router"
	PolicyRoundRobin = "round_robin"
	PolicyLeastLoad  = "least_load"
	PolicyRandom     = "random"
)

// Policies lists the values Config.Policy accepts.
func Policies() []string {
	return []string{PolicyRouter, PolicyRoundRobin, PolicyLeastLoad, PolicyRandom}
}

// Config is one bench run. A zero field means the default in its comment.
type Config struct {
	// Name labels the run in reports (default: Policy).
	Name string
	// Model is the "model" field sent (default: the first id of the first
	// target's /v1/models).
	Model string
	// Targets are base URLs ("http://127.0.0.1:8000", no path). With
	// PolicyRouter exactly one, a kvrouter.
	Targets []string
	// Policy is PolicyRouter, or a client-side policy choosing among
	// Targets (engines): PolicyRoundRobin, PolicyLeastLoad (fewest
	// in-flight requests from this client, ties to the lowest index),
	// PolicyRandom. Default: PolicyRouter with one target, else round_robin.
	Policy string
	// Metrics are the engines whose /metrics are read before and after the
	// run (default: Targets unless Policy is PolicyRouter). Unreachable
	// ones are logged and leave the engine hit rate unknown.
	Metrics []string
	// Timeout bounds each request, headers to last byte (default 10m).
	Timeout time.Duration
	// MaxInFlight caps concurrent requests; a request due while the cap is
	// reached fails with Err "overload" instead of waiting, keeping the
	// loop open (default 4096).
	MaxInFlight int
	// Reset posts /reset_prefix_cache to every Metrics engine before the
	// run, so that runs start from cold caches (vLLM serves it when
	// VLLM_SERVER_DEV_MODE=1; engine-sim always). A failed reset fails Run.
	Reset bool
	// Seed drives PolicyRandom.
	Seed uint64
	// Progress, when set, receives a progress bar redrawn in place four
	// times a second (give it a terminal: see IsTerminal).
	Progress io.Writer
}

func (cfg *Config) defaults() error {
	if cfg.Policy == "" {
		cfg.Policy = PolicyRoundRobin
		if len(cfg.Targets) == 1 {
			cfg.Policy = PolicyRouter
		}
	}
	if cfg.Name == "" {
		cfg.Name = cfg.Policy
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 10 * time.Minute
	}
	if cfg.MaxInFlight == 0 {
		cfg.MaxInFlight = 4096
	}
	if cfg.Metrics == nil && cfg.Policy != PolicyRouter {
		cfg.Metrics = cfg.Targets
	}
	var errs []error
	switch {
	case len(cfg.Targets) == 0:
		errs = append(errs, errors.New("no targets"))
	case cfg.Policy == PolicyRouter && len(cfg.Targets) != 1:
		errs = append(errs, fmt.Errorf("policy %q needs exactly one target, got %d", PolicyRouter, len(cfg.Targets)))
	}
	known := false
	for _, p := range Policies() {
		known = known || p == cfg.Policy
	}
	if !known {
		errs = append(errs, fmt.Errorf("unknown policy %q (known: %s)", cfg.Policy, strings.Join(Policies(), ", ")))
	}
	if cfg.Timeout < 0 || cfg.MaxInFlight < 0 {
		errs = append(errs, errors.New("negative timeout or max in-flight"))
	}
	for i, t := range cfg.Targets {
		cfg.Targets[i] = strings.TrimRight(t, "/")
	}
	return errors.Join(errs...)
}

// runner is one Run's state.
type runner struct {
	cfg    Config
	client *http.Client
	log    *slog.Logger

	mu       sync.Mutex
	inflight []int // per target
	rr       int
	rng      *rand.Rand
	samples  []report.Sample
	itl      report.Histogram
	sent     int
	errs     int
	late     int           // requests sent more than report.LateAfter after their time
	maxLate  time.Duration // the largest such delay
}

// Run replays w open-loop under cfg and returns the measurements. client
// nil means a client without overall timeout and generous idle pools; log
// nil discards. It returns an error only when the run cannot start (bad
// config, no model); failed requests are counted in the samples. Cancelling
// ctx stops sending and cancels requests in flight.
func Run(ctx context.Context, cfg Config, w *workload.Workload, client *http.Client, log *slog.Logger) (*report.Run, error) {
	cfg.Targets = append([]string(nil), cfg.Targets...)
	if err := cfg.defaults(); err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	if client == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = 1024
		client = &http.Client{Transport: tr}
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c := &runner{cfg: cfg, client: client, log: log.With("run", cfg.Name),
		inflight: make([]int, len(cfg.Targets)), rng: rand.New(rand.NewPCG(cfg.Seed, 0x6b76))}
	if c.cfg.Model == "" {
		m, err := c.model(ctx, cfg.Targets[0])
		if err != nil {
			return nil, fmt.Errorf("bench: %w", err)
		}
		c.cfg.Model = m
	}
	if cfg.Reset {
		for _, m := range cfg.Metrics {
			if err := c.reset(ctx, strings.TrimRight(m, "/")); err != nil {
				return nil, fmt.Errorf("bench: %w", err)
			}
		}
	}
	before, okBefore := c.scrapeAll(ctx)
	run := &report.Run{Policy: cfg.Name, Preemptions: -1, EngineHitRate: math.NaN()}
	if cfg.Policy != PolicyRouter {
		run.Replicas = append(run.Replicas, cfg.Targets...)
	}
	c.replay(ctx, w)
	run.Samples, run.ITL = c.samples, c.itl
	run.LateSends, run.MaxLateness = c.late, c.maxLate
	if okBefore {
		if after, ok := c.scrapeAll(ctx); ok {
			d := after.sub(before)
			run.Preemptions = int64(d.preemptions)
			if d.queries > 0 {
				run.EngineHitRate = d.hits / d.queries
			}
		}
	}
	return run, nil
}

// replay sends every request at its time and waits for all of them.
func (c *runner) replay(ctx context.Context, w *workload.Workload) {
	start := time.Now()
	var wg sync.WaitGroup
	stopProgress := c.progress(len(w.Requests), start)
	defer stopProgress()
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
	for i := range w.Requests {
		r := &w.Requests[i]
		if d := time.Until(start.Add(r.At)); d > 0 {
			timer.Reset(d)
			select {
			case <-ctx.Done():
			case <-timer.C:
			}
		}
		if ctx.Err() != nil {
			break
		}
		target, ok := c.pick()
		if !ok {
			now := time.Since(start)
			c.record(-1, result{s: report.Sample{ID: r.ID, Arrival: now, End: now, PromptTokens: r.InputTokens(), Err: "overload"}})
			continue
		}
		if late := time.Since(start) - r.At; late > report.LateAfter {
			c.late++
			c.maxLate = max(c.maxLate, late)
		}
		replica := ""
		if c.cfg.Policy != PolicyRouter {
			replica = c.cfg.Targets[target]
		}
		wg.Go(func() {
			c.record(target, c.send(ctx, c.cfg.Targets[target], replica, r, start))
		})
	}
	wg.Wait()
}

// pick chooses a target and counts the request in flight; false when
// MaxInFlight is reached.
func (c *runner) pick() (int, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sent++
	total := 0
	for _, n := range c.inflight {
		total += n
	}
	if total >= c.cfg.MaxInFlight {
		return 0, false
	}
	t := 0
	switch c.cfg.Policy {
	case PolicyRoundRobin:
		t = c.rr % len(c.cfg.Targets)
		c.rr++
	case PolicyLeastLoad:
		for i, n := range c.inflight {
			if n < c.inflight[t] {
				t = i
			}
		}
	case PolicyRandom:
		t = c.rng.IntN(len(c.cfg.Targets))
	}
	c.inflight[t]++
	return t, true
}

// record stores a finished request and releases its target (-1: none).
func (c *runner) record(target int, r result) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if target >= 0 {
		c.inflight[target]--
	}
	c.samples = append(c.samples, r.s)
	for _, g := range r.gaps {
		c.itl.Add(g)
	}
	if r.s.Err != "" {
		c.errs++
		c.log.Debug("request failed", "request_id", r.s.ID, "err", r.s.Err)
	}
}

// model asks base for its first model id.
func (c *runner) model(ctx context.Context, base string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/models", nil)
	if err != nil {
		return "", fmt.Errorf("list models: %w", err)
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return "", fmt.Errorf("list models: %w", err)
	}
	defer resp.Body.Close()
	var body struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&body); err != nil || resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("list models at %s: status %d, %v", base, resp.StatusCode, err)
	}
	if len(body.Data) == 0 || body.Data[0].ID == "" {
		return "", fmt.Errorf("list models at %s: no model", base)
	}
	return body.Data[0].ID, nil
}

// scrapeAll sums the counters of every Metrics engine; false when there are
// none or any is unreachable (logged).
func (c *runner) scrapeAll(ctx context.Context) (counters, bool) {
	var sum counters
	if len(c.cfg.Metrics) == 0 {
		return sum, false
	}
	for _, m := range c.cfg.Metrics {
		cs, err := c.scrape(ctx, strings.TrimRight(m, "/"))
		if err != nil {
			c.log.Warn("engine metrics unavailable; engine hit rate unknown", "err", err)
			return sum, false
		}
		sum.add(cs)
	}
	return sum, true
}

// RunAll runs cfgs one after the other on w (Run, with a nil client) and
// returns their runs in order, stopping after the run during which ctx
// ended. Several runs without Reset warn on log: each run after the first
// starts on caches the previous one warmed.
func RunAll(ctx context.Context, cfgs []Config, w *workload.Workload, log *slog.Logger) ([]*report.Run, error) {
	if len(cfgs) > 1 && !cfgs[0].Reset && log != nil {
		log.Warn("several runs against the same engines without --reset: later runs start with warm caches, so the comparison favours them")
	}
	var runs []*report.Run
	for _, c := range cfgs {
		run, err := Run(ctx, c, w, nil, log)
		if err != nil {
			return nil, err
		}
		runs = append(runs, run)
		if ctx.Err() != nil {
			break
		}
	}
	return runs, nil
}
