package sim

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strings"
	"time"

	"kvrouter/internal/bench/report"
	"kvrouter/internal/enginesim"
	"kvrouter/internal/kvindex"
	"kvrouter/internal/routing"
)

// PolicyCacheGreedy is the simulator's own policy that reads every
// replica's cache and queue at the decision: among the replicas with the
// fewest waiting requests, the one holding the longest prefix (see the
// package doc). It is a queue-avoiding greedy, not an upper bound: kv beats
// its hit rate under load. PooledBound is the reference for hit rate.
const PolicyCacheGreedy = "cache_greedy"

// PolicyOracle is PolicyCacheGreedy's former name, still accepted in
// Config.Policies (and "kvrouter sim --policies"); runs listed under it are
// reported under it.
const PolicyOracle = "oracle"

// isCacheGreedy reports whether policy names PolicyCacheGreedy.
func isCacheGreedy(policy string) bool {
	return policy == PolicyCacheGreedy || policy == PolicyOracle
}

// Policies lists the policy names Config.Policies accepts: routing's, then
// PolicyCacheGreedy (PolicyOracle, its former name, is accepted too).
func Policies() []string { return append(routing.Policies(), PolicyCacheGreedy) }

// DefaultPolicies is the comparison run when Config.Policies is empty.
var defaultPolicies = []string{"round_robin", "least_load", "session", "kv", PolicyCacheGreedy}

// DefaultPolicies returns the policies compared when none are given.
func DefaultPolicies() []string { return slices.Clone(defaultPolicies) }

// Scale changes the fleet at a point of the run.
type Scale struct {
	// At is the virtual time of the change, from the run's start.
	At time.Duration
	// Delta adds replicas (> 0, cold, named r<N> after the existing ones)
	// or removes the most recently added ones (< 0; they drain).
	Delta int
}

// Config configures a simulation. A zero field means the default in its
// comment.
type Config struct {
	// Replicas is the fleet size at the start (default 8).
	Replicas int
	// Policies are compared, each on the whole workload (default
	// round_robin, least_load, kv, cache_greedy).
	Policies []string
	// Engine configures every replica's Core (default: enginesim's
	// defaults, profile h100-llama3-8b). KV events are always on for
	// policies that use the index; the hasher is the fast one.
	Engine enginesim.CoreConfig
	// Routing configures the router (weights, rates); Policy, Now and Rand
	// are set per run. A zero PrefillRate takes the engine profile's.
	Routing routing.Config
	// Index configures the exact index; Now and BlockSize are set per run.
	Index kvindex.Config
	// EventDelay is how long a KV event batch takes from the end of the
	// engine step that produced it to the index (default 0: instant;
	// negative is invalid).
	EventDelay time.Duration
	// EventLoss is the probability, 0..1, that a batch is lost (default 0).
	EventLoss float64
	// GaugeInterval is how often the router's engine gauges are refreshed
	// (default 1s, kvrouter's scrape interval; negative disables).
	GaugeInterval time.Duration
	// Scale lists fleet changes, in any order.
	Scale []Scale
	// PrefillScale makes the fleet heterogeneous: replica i prefills at
	// PrefillScale[i mod len] times the engine's prefill throughput
	// (default: all 1; each must be positive). Example: 1, 0.4 mixes two
	// GPU generations half and half.
	PrefillScale []float64
	// Rates is what the router knows of each replica's prefill rate:
	// RatesConfigured (default) uses Routing's rates for every replica (the
	// engine profile's when Routing.PrefillRate is zero), RatesKnown sets
	// each replica's true prefill rate, RatesLearned starts from the
	// configured rates and learns both from the engines' counters at every
	// gauge refresh (routing.Router.ObserveRates, as serve does from
	// /metrics).
	Rates string
	// SLO is the goodput threshold (default TTFT 2s, TPOT 100ms).
	SLO report.SLO
	// Seed makes runs reproducible (routing tie-breaks, event loss). Each
	// policy's randomness derives from Seed and the policy's name, so a
	// policy's run does not depend on the other policies listed.
	Seed uint64
	// Draw reruns Seed's workload and arrivals with other random choices
	// (0: Seed's own run). Draw d != 0 changes every policy's random
	// draws (routing tie-breaks, event loss) and renames every
	// conversation (Request.SessionKey gets the suffix "#d"), which moves
	// session's rendezvous placement as other conversation ids would. Runs
	// at several draws measure a policy's expected result on one set of
	// arrivals rather than one draw of it.
	Draw uint64
	// Parallel is how many policies run at once (default GOMAXPROCS).
	Parallel int
	// Routers is the number of router replicas (default 1): each has its
	// own leases and, for policies with an index, its own index and
	// predictions, all fed the same KV events and gauges; Front spreads
	// the requests over them. With more than one, KV events are applied
	// on the fleet's goroutine (Pipeline is off).
	Routers int
	// Front is the balancer in front of the router replicas:
	// FrontRoundRobin (default) or FrontRandom.
	Front string
	// NoStripes, with Routers > 1, leaves the router replicas' Routers and
	// RouterIndex (routing.Config) unset, so that they do not stripe their
	// tie-breaks (the behaviour before stripes; by default replica k of N
	// is configured as router_index k of routers N, as docs/routing.md
	// recommends).
	NoStripes bool
	// Pipeline chooses whether a policy that keeps an index applies its KV
	// event batches on a second goroutine, overlapped with the engine steps
	// and the arrivals' token expansion; the fleet waits for that goroutine
	// only before it routes, scales or ends. Reports are identical either
	// way, only the wall time differs, and it costs a copy of every batch's
	// events. PipelineAuto (default) starts a policy's pipeline once fewer
	// policies remain to run than GOMAXPROCS, so it uses a core nothing
	// else would (a one-policy run on 2 cores pipelines from the start; the
	// default four policies with Parallel 2 pipeline only the last one
	// running). PipelineOn pipelines from the start even when policies
	// compete for the cores, PipelineOff never. Measured on 2 cores, the
	// Mooncake trace twice over 64 replicas: kv alone 11.6 s -> 10.1 s wall
	// (same CPU); the four default policies are CPU-bound (about 24 s of
	// CPU, 12.5 s wall) and gain nothing from on.
	Pipeline PipelineMode
	// AdapterReplicas is on how many replicas each LoRA adapter of the
	// workload is loaded (0: every replica): adapter a is on replica i
	// when (i + fnv32a(a)) mod Replicas < AdapterReplicas. A request for an
	// adapter is routed only among those replicas, under every policy, and
	// keyed with the adapter's name (kvindex.Extras.LoRA). The oracle
	// cannot run with adapters (its cache reads are plain-prompt hashes).
	AdapterReplicas int
	// PD, with PrefillReplicas > 0, compares P/D arrangements (pdsim.go)
	// instead of policies: Policies default to Arrangements().
	PD PDConfig
	// DPSize, above 1, makes each of the Replicas engines DPSize
	// data-parallel ranks behind one endpoint, each its own cache and
	// queue (dp.go); not with Scale, PD, AdapterReplicas, PrefillScale or
	// RatesLearned.
	DPSize int
	// DPRankBlind, with DPSize above 1, routes to engines instead of ranks
	// and leaves the rank to vLLM's balancer (dp.go).
	DPRankBlind bool
}

// Values of Config.Rates.
const (
	RatesConfigured = "configured"
	RatesKnown      = "known"
	RatesLearned    = "learned"
)

// Defaults of Config's zero fields.
const (
	DefaultReplicas      = 8
	DefaultGaugeInterval = time.Second
	DefaultSLOTTFT       = 2 * time.Second
	DefaultSLOITL        = 100 * time.Millisecond
)

// withDefaults fills zero fields and checks cfg, returning every problem.
func (cfg Config) withDefaults() (Config, error) {
	if cfg.Replicas == 0 {
		cfg.Replicas = DefaultReplicas
	}
	if len(cfg.Policies) == 0 {
		cfg.Policies = DefaultPolicies()
		if cfg.PD.PrefillReplicas != 0 {
			cfg.Policies = Arrangements()
		}
	}
	if cfg.GaugeInterval == 0 {
		cfg.GaugeInterval = DefaultGaugeInterval
	}
	if cfg.SLO.TTFT == 0 {
		cfg.SLO.TTFT = DefaultSLOTTFT
	}
	if cfg.SLO.ITL == 0 {
		cfg.SLO.ITL = DefaultSLOITL
	}
	if cfg.Parallel == 0 {
		cfg.Parallel = runtime.GOMAXPROCS(0)
	}
	if cfg.Routers == 0 {
		cfg.Routers = 1
	}
	if cfg.Front == "" {
		cfg.Front = FrontRoundRobin
	}
	var errs []error
	if cfg.Replicas < 1 {
		errs = append(errs, fmt.Errorf("replicas %d: need at least 1", cfg.Replicas))
	}
	seen := map[string]bool{}
	for _, p := range cfg.Policies {
		if !slices.Contains(Policies(), p) && p != PolicyOracle && (cfg.PD.PrefillReplicas == 0 || !slices.Contains(Arrangements(), p)) {
			errs = append(errs, fmt.Errorf("unknown policy %q (known: %s)", p, strings.Join(Policies(), ", ")))
		}
		canon := p
		if isCacheGreedy(p) {
			canon = PolicyCacheGreedy
		}
		if seen[canon] {
			errs = append(errs, fmt.Errorf("policy %q listed twice", p))
		}
		seen[canon] = true
	}
	if cfg.EventDelay < 0 {
		errs = append(errs, fmt.Errorf("event delay %v: must not be negative", cfg.EventDelay))
	}
	if !(cfg.EventLoss >= 0 && cfg.EventLoss <= 1) {
		errs = append(errs, fmt.Errorf("event loss %v: must be in 0..1", cfg.EventLoss))
	}
	if cfg.Routers < 1 || cfg.Routers > 64 {
		errs = append(errs, fmt.Errorf("routers %d: want 1..64", cfg.Routers))
	}
	if cfg.Front != FrontRoundRobin && cfg.Front != FrontRandom {
		errs = append(errs, fmt.Errorf("front %q: want %s or %s", cfg.Front, FrontRoundRobin, FrontRandom))
	}
	if cfg.Routers > 1 {
		cfg.Pipeline = PipelineOff
	}
	switch cfg.Pipeline {
	case "":
		cfg.Pipeline = PipelineAuto
	case PipelineAuto, PipelineOn, PipelineOff:
	default:
		errs = append(errs, fmt.Errorf("pipeline %q: want %s, %s or %s", cfg.Pipeline, PipelineAuto, PipelineOn, PipelineOff))
	}
	switch cfg.Rates {
	case "":
		cfg.Rates = RatesConfigured
	case RatesConfigured, RatesKnown, RatesLearned:
	default:
		errs = append(errs, fmt.Errorf("rates %q: want %s, %s or %s", cfg.Rates, RatesConfigured, RatesKnown, RatesLearned))
	}
	for _, x := range cfg.PrefillScale {
		if !(x > 0) || math.IsInf(x, 0) {
			errs = append(errs, fmt.Errorf("prefill scale %v: must be positive and finite", x))
		}
	}
	if cfg.AdapterReplicas < 0 || cfg.AdapterReplicas > cfg.Replicas {
		errs = append(errs, fmt.Errorf("adapter replicas %d: want 0..%d", cfg.AdapterReplicas, cfg.Replicas))
	}
	if cfg.AdapterReplicas > 0 && slices.Contains(cfg.Policies, PolicyOracle) {
		errs = append(errs, fmt.Errorf("policy %s does not model LoRA adapters: leave it out with adapter replicas set", PolicyOracle))
	}
	if cfg.Parallel < 1 {
		errs = append(errs, fmt.Errorf("parallel %d: need at least 1", cfg.Parallel))
	}
	if cfg.DPSize < 0 || cfg.DPSize > 64 || cfg.DPRankBlind && cfg.DPSize < 2 {
		errs = append(errs, fmt.Errorf("dp size %d (rank-blind %v): want 0..64, at least 2 when rank-blind", cfg.DPSize, cfg.DPRankBlind))
	}
	if cfg.DPSize > 1 && (len(cfg.Scale) > 0 || cfg.PD.PrefillReplicas > 0 || cfg.AdapterReplicas > 0 || len(cfg.PrefillScale) > 0 || cfg.Rates == RatesLearned) {
		errs = append(errs, fmt.Errorf("dp size %d: not with scaling, P/D, adapter replicas, prefill scales or learned rates", cfg.DPSize))
	}
	n := cfg.Replicas
	scale := slices.Clone(cfg.Scale)
	slices.SortStableFunc(scale, func(a, b Scale) int { return int(a.At - b.At) })
	for _, s := range scale {
		if s.At < 0 {
			errs = append(errs, fmt.Errorf("scale at %v: must not be negative", s.At))
		}
		if n += s.Delta; n < 1 {
			errs = append(errs, fmt.Errorf("scale at %v leaves %d replicas", s.At, n))
		}
	}
	cfg.Scale = scale
	errs = append(errs, cfg.validatePD()...)
	return cfg, errors.Join(errs...)
}

// cacheBlind reports whether policy ignores the index, so its runs skip KV
// events altogether.
func cacheBlind(policy string) bool {
	switch policy {
	case "round_robin", "least_load", "random":
		return true
	}
	return false
}
