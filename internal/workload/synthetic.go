package workload

import (
	"errors"
	"fmt"
	"math/rand/v2"
)

// The synthetic generators below fix every length (tokens) so that a run's
// cost is predictable; randomness (from the caller's *rand.Rand) only
// decides order and, for HotPrefix, which requests share the hot prefix.
// Arrival times are left at zero: pass the result to Poisson. A nil rng
// keeps generation order (SharedPrefix: group by group; MultiTurn:
// conversations taking turns); HotPrefix needs one.

// SharedPrefix is Groups groups of Prompts requests each; a group's requests
// share a SystemTokens-long system prompt and differ by a QuestionTokens-long
// question. Requests of all groups are shuffled together; the session is
// the group ("group-3").
type SharedPrefix struct {
	Groups, Prompts              int
	SystemTokens, QuestionTokens int
	OutputTokens                 int
}

// Generate builds the workload.
func (g SharedPrefix) Generate(rng *rand.Rand) (*Workload, error) {
	if err := errors.Join(
		positive("groups", g.Groups, 1<<24), positive("prompts", g.Prompts, 1<<20),
		nonNegative("system_tokens", g.SystemTokens), positive("question_tokens", g.QuestionTokens, maxInputLength),
		nonNegative("output_tokens", g.OutputTokens),
	); err != nil {
		return nil, fmt.Errorf("shared prefix: %w", err)
	}
	rs := make([]Request, 0, g.Groups*g.Prompts)
	for gi := range g.Groups {
		for p := range g.Prompts {
			rs = append(rs, Request{
				ID:           fmt.Sprintf("shared-g%d-p%d", gi, p),
				Prompt:       segs(Segment{key(nsSystem, uint64(gi), 0, 0), g.SystemTokens}, Segment{key(nsQuestion, uint64(gi), uint64(p), 0), g.QuestionTokens}),
				OutputTokens: g.OutputTokens,
				Session:      fmt.Sprintf("group-%d", gi),
			})
		}
	}
	if rng != nil {
		rng.Shuffle(len(rs), func(i, j int) { rs[i], rs[j] = rs[j], rs[i] })
	}
	return &Workload{Name: "shared_prefix", Params: params("groups", g.Groups, "prompts", g.Prompts,
		"system_tokens", g.SystemTokens, "question_tokens", g.QuestionTokens, "output_tokens", g.OutputTokens), Requests: rs}, nil
}

// MultiTurn is Conversations chats of Turns turns. Turn t's prompt is the
// system prompt (shared by all conversations when SharedSystem, else one per
// conversation), then for each earlier turn its user message and the
// answer, then turn t's user message: the prompt grows by UserTokens +
// OutputTokens per turn, and each turn's prompt extends the previous one.
// Conversations are interleaved at random keeping each one's turn order;
// the session is the conversation ("conv-12").
type MultiTurn struct {
	Conversations, Turns     int
	SystemTokens, UserTokens int
	OutputTokens             int
	SharedSystem             bool
}

// Generate builds the workload.
func (g MultiTurn) Generate(rng *rand.Rand) (*Workload, error) {
	if err := errors.Join(
		positive("conversations", g.Conversations, 1<<24), positive("turns", g.Turns, 1<<12),
		nonNegative("system_tokens", g.SystemTokens), positive("user_tokens", g.UserTokens, maxInputLength),
		nonNegative("output_tokens", g.OutputTokens),
	); err != nil {
		return nil, fmt.Errorf("multi-turn: %w", err)
	}
	convs := make([][]Request, g.Conversations)
	for c := range convs {
		sys := uint64(c)
		if g.SharedSystem {
			sys = 1 << 23 // outside the conversation indices' range
		}
		prompt := segs(Segment{key(nsSystem, sys, 1, 0), g.SystemTokens})
		for t := range g.Turns {
			prompt = append(prompt, Segment{key(nsUser, uint64(c), 0, uint64(t)), g.UserTokens})
			convs[c] = append(convs[c], Request{
				ID:           fmt.Sprintf("conv-%d-t%d", c, t),
				Prompt:       append([]Segment(nil), prompt...),
				OutputTokens: g.OutputTokens,
				Session:      fmt.Sprintf("conv-%d", c),
			})
			if g.OutputTokens > 0 {
				prompt = append(prompt, Segment{key(nsAnswer, uint64(c), 0, uint64(t)), g.OutputTokens})
			}
		}
	}
	return &Workload{Name: "multi_turn", Params: params("conversations", g.Conversations, "turns", g.Turns,
		"system_tokens", g.SystemTokens, "user_tokens", g.UserTokens, "output_tokens", g.OutputTokens,
		"shared_system", g.SharedSystem), Requests: interleave(convs, rng)}, nil
}

// interleave merges the lists in a random order that keeps each list's own
// order: at each step it takes the head of a list chosen with probability
// proportional to what the list has left. A nil rng takes the lists' heads
// in turn.
func interleave(lists [][]Request, rng *rand.Rand) []Request {
	total := 0
	for _, l := range lists {
		total += len(l)
	}
	out := make([]Request, 0, total)
	if rng == nil {
		for len(out) < total {
			for i := range lists {
				if len(lists[i]) > 0 {
					out = append(out, lists[i][0])
					lists[i] = lists[i][1:]
				}
			}
		}
		return out
	}
	for left := total; left > 0; left-- {
		pick := rng.IntN(left)
		for i := range lists {
			if pick < len(lists[i]) {
				out = append(out, lists[i][0])
				lists[i] = lists[i][1:]
				break
			}
			pick -= len(lists[i])
		}
	}
	return out
}

// Unique is Requests prompts of PromptTokens tokens that share nothing, not
// even their first token: the regime where prefix routing can only cost.
type Unique struct {
	Requests, PromptTokens, OutputTokens int
}

// Generate builds the workload; rng is unused (kept for a uniform shape).
func (g Unique) Generate(*rand.Rand) (*Workload, error) {
	if err := errors.Join(
		positive("requests", g.Requests, 1<<24), positive("prompt_tokens", g.PromptTokens, maxInputLength),
		nonNegative("output_tokens", g.OutputTokens),
	); err != nil {
		return nil, fmt.Errorf("unique: %w", err)
	}
	rs := make([]Request, g.Requests)
	for i := range rs {
		rs[i] = Request{
			ID:           fmt.Sprintf("unique-%d", i),
			Prompt:       segs(Segment{key(nsUnique, uint64(i), 0, 0), g.PromptTokens}),
			OutputTokens: g.OutputTokens,
		}
	}
	return &Workload{Name: "unique", Params: params("requests", g.Requests, "prompt_tokens", g.PromptTokens,
		"output_tokens", g.OutputTokens), Requests: rs}, nil
}

// HotPrefix is Requests requests of which a share HotShare (0..1, drawn per
// request) starts with one PrefixTokens-long prefix, the hot spot that pins
// naive affinity to one replica; the others start with a prefix of the same
// length of their own. Every request ends with its own SuffixTokens.
type HotPrefix struct {
	Requests                   int
	HotShare                   float64
	PrefixTokens, SuffixTokens int
	OutputTokens               int
}

// Generate builds the workload.
func (g HotPrefix) Generate(rng *rand.Rand) (*Workload, error) {
	var errShare error
	if !(g.HotShare >= 0 && g.HotShare <= 1) {
		errShare = fmt.Errorf("hot_share %v not in 0..1", g.HotShare)
	}
	if rng == nil {
		errShare = errors.Join(errShare, errors.New("needs a *rand.Rand"))
	}
	if err := errors.Join(
		positive("requests", g.Requests, 1<<24), errShare,
		positive("prefix_tokens", g.PrefixTokens, maxInputLength), positive("suffix_tokens", g.SuffixTokens, maxInputLength),
		nonNegative("output_tokens", g.OutputTokens),
	); err != nil {
		return nil, fmt.Errorf("hot prefix: %w", err)
	}
	rs := make([]Request, g.Requests)
	for i := range rs {
		pre := key(nsHot, uint64(i)+1, 0, 0)
		if rng.Float64() < g.HotShare {
			pre = key(nsHot, 0, 0, 0)
		}
		rs[i] = Request{
			ID:           fmt.Sprintf("hot-%d", i),
			Prompt:       segs(Segment{pre, g.PrefixTokens}, Segment{key(nsHotSuffix, uint64(i), 0, 0), g.SuffixTokens}),
			OutputTokens: g.OutputTokens,
		}
	}
	return &Workload{Name: "hot_prefix", Params: params("requests", g.Requests, "hot_share", g.HotShare,
		"prefix_tokens", g.PrefixTokens, "suffix_tokens", g.SuffixTokens, "output_tokens", g.OutputTokens), Requests: rs}, nil
}

// segs returns the segments with zero-length ones left out.
func segs(ss ...Segment) []Segment {
	out := ss[:0]
	for _, s := range ss {
		if s.Len > 0 {
			out = append(out, s)
		}
	}
	return out
}

func positive(name string, v, limit int) error {
	if v < 1 || v >= limit {
		return fmt.Errorf("%s %d not in 1..%d", name, v, limit-1)
	}
	return nil
}

func nonNegative(name string, v int) error {
	if v < 0 || v > maxInputLength {
		return fmt.Errorf("%s %d not in 0..%d", name, v, maxInputLength)
	}
	return nil
}

func params(kv ...any) map[string]string {
	m := make(map[string]string, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i].(string)] = fmt.Sprint(kv[i+1])
	}
	return m
}
