package workload

import (
	"fmt"
	"math/rand/v2"
	"strings"
)

// Spec names the requests a live replay (kvrouter bench) sends: the
// Mooncake trace's records or a synthetic generator's, with their
// arrival times.
type Spec struct {
	// Kind is one of Kinds.
	Kind string
	// Requests: mooncake, the records replayed (0: all); synthetic kinds,
	// the requests (0: 200; shared_prefix rounds down to a multiple of
	// Groups, multi_turn to whole 6-turn conversations).
	Requests int
	// Skip (mooncake) records first; Speed divides the trace's
	// inter-arrival times; MaxInput truncates prompts and MaxOutput caps
	// outputs, in tokens (0: keep).
	Skip                int
	Speed               float64
	MaxInput, MaxOutput int
	// Rate, when > 0, gives Poisson arrivals at that many requests/s
	// (synthetic kinds: default 10; mooncake: replacing the trace's
	// timestamps).
	Rate float64
	// Seed drives the generators and the Poisson arrivals.
	Seed uint64
	// Token counts of the synthetic kinds: PromptTokens (unique),
	// PrefixTokens and SuffixTokens (hot_prefix, shared_prefix,
	// multi_turn), OutputTokens (all); Groups of shared_prefix; HotShare
	// (0..1) of hot_prefix.
	PromptTokens, PrefixTokens, SuffixTokens, OutputTokens, Groups int
	HotShare                                                       float64
}

// Kinds are the workloads a Spec can name.
func Kinds() []string {
	return []string{"mooncake", "unique", "hot_prefix", "shared_prefix", "multi_turn"}
}

// Build makes the requests s names; trace is the Mooncake trace (read only
// by Kind mooncake). Every error is s's: an unknown kind or bad sizes.
func (s Spec) Build(trace []TraceRecord) (*Workload, error) {
	rng := rand.New(rand.NewPCG(s.Seed, 0xbe4c))
	var w *Workload
	var err error
	n := s.Requests
	if n == 0 {
		n = 200
	}
	out := s.OutputTokens
	switch s.Kind {
	case "mooncake":
		w, err = Mooncake(trace, MooncakeOptions{Speed: s.Speed, Skip: s.Skip, Limit: s.Requests, MaxInputTokens: s.MaxInput, MaxOutputTokens: s.MaxOutput})
	case "unique":
		w, err = Unique{Requests: n, PromptTokens: s.PromptTokens, OutputTokens: out}.Generate(rng)
	case "hot_prefix":
		w, err = HotPrefix{Requests: n, HotShare: s.HotShare, PrefixTokens: s.PrefixTokens, SuffixTokens: s.SuffixTokens, OutputTokens: out}.Generate(rng)
	case "shared_prefix":
		w, err = SharedPrefix{Groups: s.Groups, Prompts: max(1, n/s.Groups), SystemTokens: s.PrefixTokens, QuestionTokens: s.SuffixTokens, OutputTokens: out}.Generate(rng)
	case "multi_turn":
		w, err = MultiTurn{Conversations: max(1, n/6), Turns: 6, SystemTokens: s.PrefixTokens, UserTokens: s.SuffixTokens, OutputTokens: out, SharedSystem: true}.Generate(rng)
	default:
		return nil, fmt.Errorf("unknown workload %q (known: %s)", s.Kind, strings.Join(Kinds(), ", "))
	}
	if err != nil {
		return nil, err
	}
	if s.Kind != "mooncake" || s.Rate > 0 {
		rate := s.Rate
		if rate == 0 {
			rate = 10
		}
		if err := Poisson(w, rate, rng); err != nil {
			return nil, err
		}
	}
	return w, nil
}
