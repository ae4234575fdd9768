package sim

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"

	"kvrouter/internal/workload"
)

// ScenarioInfo names a scenario and says what it stresses.
type ScenarioInfo struct {
	Name, Description string
}

// Scenarios lists the scenarios BuildScenario knows: the Mooncake trace and
// the regimes where routing by prefix can lose.
func Scenarios() []ScenarioInfo {
	return []ScenarioInfo{
		{"mooncake", "Mooncake FAST'25 conversation trace, time-compressed to the load"},
		{"unique", "unique 2,048-token prompts: nothing to reuse, prefix routing can only cost"},
		{"hot_prefix", "80% of requests share one 4,096-token prefix: affinity would pin them to one replica"},
		{"saturation", "Mooncake trace near saturation: affinity's imbalance meets full queues"},
		{"scale_out", "multi-turn chats on half the fleet, the other half added cold at 1/3 of the run"},
		{"shared_prefix", "64 groups sharing 2,048-token system prompts, 256-token questions"},
		{"multi_turn", "chats of 6 turns whose prompts grow turn by turn, one shared system prompt"},
		{"lora_mix", "shared_prefix with half the groups on one of 4 LoRA adapters, each adapter loaded on 2 replicas of 8 (quarter of the fleet)"},
		{"long_prompt", "unique 8,192-token prompts, 64-token answers: where prefill and decode interfere most"},
	}
}

// ScenarioOptions size a scenario. A zero field means the default in its
// comment.
type ScenarioOptions struct {
	// Replicas is the final fleet size (8).
	Replicas int
	// Load is the offered load: prompt tokens per second over the fleet's
	// prefill capacity (Replicas x PrefillRate), as if nothing were cached;
	// prefix caching lowers the real load, decode work adds to it. Default
	// per scenario (DefaultLoad).
	Load float64
	// Requests sizes synthetic scenarios (4,000); Mooncake scenarios take
	// the first Requests records when set, else the whole trace.
	Requests int
	// PrefillRate is one replica's prefill throughput in tokens/s (20,000,
	// enginesim's h100 profile).
	PrefillRate float64
	// Trace is the Mooncake trace (needed by mooncake and saturation).
	Trace []workload.TraceRecord
	// Seed drives the generators and Poisson arrivals.
	Seed uint64
}

// Scenario is a workload plus the fleet changes it needs.
type Scenario struct {
	Name     string
	Workload *workload.Workload
	// Replicas is the fleet size at the start.
	Replicas int
	// Scale holds fleet changes (scale_out).
	Scale []Scale
	// Load is the offered load actually used.
	Load float64
	// AdapterReplicas is Config.AdapterReplicas for the scenario (lora_mix).
	AdapterReplicas int
}

// BuildScenario builds the named scenario.
func BuildScenario(name string, o ScenarioOptions) (*Scenario, error) {
	if o.Replicas == 0 {
		o.Replicas = DefaultReplicas
	}
	if o.Requests == 0 && name != "mooncake" && name != "saturation" {
		o.Requests = 4000
	}
	if o.PrefillRate == 0 {
		o.PrefillRate = 20000
	}
	if o.Load == 0 {
		o.Load = DefaultLoad(name)
	}
	var errs []error
	if o.Replicas < 1 {
		errs = append(errs, fmt.Errorf("replicas %d: need at least 1", o.Replicas))
	}
	if o.Requests < 0 {
		errs = append(errs, fmt.Errorf("requests %d: must not be negative", o.Requests))
	}
	if !(o.Load > 0) || math.IsInf(o.Load, 0) {
		errs = append(errs, fmt.Errorf("load %v: must be positive and finite", o.Load))
	}
	if !(o.PrefillRate > 0) || math.IsInf(o.PrefillRate, 0) {
		errs = append(errs, fmt.Errorf("prefill rate %v: must be positive and finite", o.PrefillRate))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("scenario %s: %w", name, err)
	}
	rng := rand.New(rand.NewPCG(o.Seed, 0x5ce7))
	sc := &Scenario{Name: name, Replicas: o.Replicas, Load: o.Load}
	var w *workload.Workload
	var err error
	switch name {
	case "mooncake", "saturation":
		if len(o.Trace) == 0 {
			return nil, fmt.Errorf("scenario %s: no trace", name)
		}
		w, err = workload.Mooncake(o.Trace, workload.MooncakeOptions{Limit: o.Requests})
		if err == nil {
			err = workload.Scale(w, speedFor(w, o))
		}
	case "unique":
		w, err = workload.Unique{Requests: o.Requests, PromptTokens: 2048, OutputTokens: 128}.Generate(rng)
		err = poisson(w, err, o, rng)
	case "long_prompt":
		w, err = workload.Unique{Requests: o.Requests, PromptTokens: 8192, OutputTokens: 64}.Generate(rng)
		err = poisson(w, err, o, rng)
	case "hot_prefix":
		w, err = workload.HotPrefix{Requests: o.Requests, HotShare: 0.8, PrefixTokens: 4096, SuffixTokens: 256, OutputTokens: 128}.Generate(rng)
		err = poisson(w, err, o, rng)
	case "shared_prefix":
		w, err = workload.SharedPrefix{Groups: 64, Prompts: max(1, o.Requests/64), SystemTokens: 2048, QuestionTokens: 256, OutputTokens: 128}.Generate(rng)
		err = poisson(w, err, o, rng)
	case "lora_mix":
		w, err = workload.SharedPrefix{Groups: 64, Prompts: max(1, o.Requests/64), SystemTokens: 2048, QuestionTokens: 256, OutputTokens: 128}.Generate(rng)
		err = poisson(w, err, o, rng)
		if err == nil {
			assignAdapters(w, 4)
			sc.AdapterReplicas = max(1, o.Replicas/4)
		}
	case "multi_turn", "scale_out":
		w, err = workload.MultiTurn{Conversations: max(1, o.Requests/6), Turns: 6, SystemTokens: 1024, UserTokens: 256, OutputTokens: 192, SharedSystem: true}.Generate(rng)
		err = poisson(w, err, o, rng)
		if err == nil && name == "scale_out" {
			half := max(1, o.Replicas/2)
			sc.Replicas = half
			span := w.Requests[len(w.Requests)-1].At
			sc.Scale = []Scale{{At: span / 3, Delta: o.Replicas - half}}
		}
	default:
		var known []string
		for _, s := range Scenarios() {
			known = append(known, s.Name)
		}
		return nil, fmt.Errorf("unknown scenario %q (known: %s)", name, strings.Join(known, ", "))
	}
	if err != nil {
		return nil, fmt.Errorf("scenario %s: %w", name, err)
	}
	w.Params["scenario"] = name
	w.Params["load"] = fmt.Sprint(o.Load)
	w.Params["replicas"] = fmt.Sprint(o.Replicas)
	sc.Workload = w
	return sc, nil
}

// DefaultLoad is the offered load a scenario runs at unless told otherwise
// (see ScenarioOptions.Load): chosen so that round_robin is busy but not
// drowning, except where the regime is the point (saturation; hot_prefix,
// whose hot prefix only caching makes affordable).
func DefaultLoad(scenario string) float64 {
	switch scenario {
	case "mooncake":
		return 0.5
	case "saturation":
		return 0.8
	case "hot_prefix":
		return 3.0
	case "scale_out", "multi_turn", "shared_prefix":
		return 1.0
	}
	return 0.7
}

// speedFor is the time compression that makes a trace offer o.Load.
func speedFor(w *workload.Workload, o ScenarioOptions) float64 {
	in := w.Info()
	if in.DurationS <= 0 || in.InputTokens == 0 {
		return 1
	}
	return o.Load * float64(o.Replicas) * o.PrefillRate * in.DurationS / float64(in.InputTokens)
}

// poisson gives w Poisson arrivals at the rate that offers o.Load.
func poisson(w *workload.Workload, err error, o ScenarioOptions, rng *rand.Rand) error {
	if err != nil {
		return err
	}
	perReq := float64(w.Info().InputTokens) / float64(len(w.Requests))
	rate := o.Load * float64(o.Replicas) * o.PrefillRate / perReq
	return workload.Poisson(w, rate, rng)
}
