package routing

import (
	"math/rand/v2"
	"sync"

	"kvrouter/internal/kvindex"
)

// Request is what a policy knows about one request.
type Request struct {
	// ID names the request in logs (optional).
	ID string
	// Tokens are the prompt's token ids as the engine will see them; nil
	// when unknown (then only Text-based and load-based policies can work).
	Tokens []uint32
	// Keys are the prompt's block keys. Route fills them from Tokens when
	// nil; set them to reuse keys computed elsewhere.
	Keys []kvindex.Key
	// KeyMemo, when not nil, keeps block keys of the prompt's leading
	// tokens between requests (the tokenizer's prefix cache): Route takes
	// the keys it kept and hashes only the blocks after them.
	KeyMemo KeyMemo
	// Extras are the non-token inputs of the block keys (LoRA name,
	// cache_salt, multimodal items). Route sets Extras.Root.
	Extras kvindex.Extras
	// PromptTokens is the prompt length in tokens; 0 means len(Tokens).
	PromptTokens int
	// MaxTokens is the expected output length in tokens, for decode load;
	// 0 means Config.DefaultMaxTokens.
	MaxTokens int
	// Text is the prompt's routing text for prefix_chars (see PrefixChars:
	// a completion's prompt, a chat's message contents joined by "\n", or
	// TokenText of a token-id prompt); optional, ignored by other policies.
	Text string
	// SessionKey pins a conversation (e.g. the x-session-id header) for the
	// session policy; "" means none.
	SessionKey string
	// Exclude lists replica names not to choose (already tried).
	Exclude []string
}

// promptTokens returns the prompt length in tokens.
func (r *Request) promptTokens() int {
	if r.PromptTokens > 0 {
		return r.PromptTokens
	}
	return len(r.Tokens)
}

// Load is one replica's load as the policies see it.
type Load struct {
	// InFlight counts requests this router sent that have not finished.
	InFlight int64
	// QueuedPrefill is the uncached prompt tokens of in-flight requests
	// that have not produced their first token.
	QueuedPrefill int64
	// RunningDecode is the expected output tokens of in-flight requests
	// past their first token.
	RunningDecode int64
	// ActiveTokens is prompt plus expected output tokens of all in-flight
	// requests: their KV footprint.
	ActiveTokens int64
	// Waiting, Running and KVUsage (0..1) are the engine's gauges
	// (vllm:num_requests_waiting, vllm:num_requests_running,
	// vllm:kv_cache_usage_perc); zero unless Fresh.
	Waiting, Running int
	KVUsage          float64
	// Fresh reports whether the gauges are younger than Config.GaugeMaxAge.
	Fresh bool
	// PrefillRate and DecodeRate are the replica's throughput in tokens/s
	// (Config defaults unless set with SetRates).
	PrefillRate, DecodeRate float64
}

// Candidate is one replica a policy may choose.
type Candidate struct {
	// Name is the replica's name (engine name or URL).
	Name string
	// ID is the replica's index ID.
	ID kvindex.ReplicaID
	// Match is the replica's leading cached blocks for the request.
	Match kvindex.Match
	// Held is the number of blocks the index holds for the replica (its
	// "tree size"), or -1 when the index does not tell.
	Held int
	// Capacity is the replica's KV cache size in blocks (vLLM's
	// num_gpu_blocks, per data-parallel rank; Router.SetCapacity), 0 when
	// unknown. With Held it tells how many blocks a placement can write
	// before the engine evicts (kv's cache pressure).
	Capacity int
	// Load is the replica's load.
	Load Load
	// Stripe is the candidate's rank for this router replica
	// (Config.Routers, RouterIndex): 0 when the engine is in the router's
	// own stripe, 1 in the next router's, ...; always 0 with one router.
	// Ties (pickMin) and near-ties (KVConfig.StripeSlack) go to the lower
	// rank, so that router replicas deciding at once without seeing each
	// other's leases choose different engines.
	Stripe int
}

// Terms are one candidate's share of a Decision: the inputs and result of
// the policy's cost, so that a decision can be explained afterwards.
type Terms struct {
	Name string
	// CachedBlocks is the leading blocks held or predicted (Match.Blocks).
	CachedBlocks int
	// Overlap is CachedBlocks weighted by tier (kv), in blocks.
	Overlap float64
	// Credit is the prompt tokens counted as cached (kv, dynamo).
	Credit float64
	// NewTokens is the prompt tokens left to prefill.
	NewTokens float64
	// Evict is the cache pressure (kv): seconds of prefill that the blocks
	// this placement would push out of the replica's cache are worth, 0
	// while the replica has room. Included in Cost.
	Evict float64
	// Cost is the policy's cost, lower is better. Unit: seconds (kv),
	// blocks (dynamo), negated weighted score (llmd), else the policy's
	// own ranking (see each policy).
	Cost float64
}

// Decision is a policy's choice and the record of why.
type Decision struct {
	// Policy is the policy's name.
	Policy string
	// Index is the chosen candidate's position in the candidates, -1 when
	// there were none.
	Index int
	// Name is the chosen replica's name.
	Name string
	// Reason says how the choice was made: "min_cost", "tie_load", "tie_stripe",
	// "tie_random", "affinity", "spread", "stripe", "session", "imbalanced",
	// "prefix", "no_match", ...
	Reason string
	// Terms has one entry per candidate, in candidate order.
	Terms []Terms
	// IndexBlocks is the chosen replica's leading blocks the index says it
	// holds (not merely predicted), whether or not the policy saw them: it
	// differs
	// from Chosen().CachedBlocks when the replica's index is distrusted
	// (Router.SetIndexTrusted). Set by Router.Route and Router.Evaluate.
	IndexBlocks int
}

// Chosen returns the chosen candidate's terms (zero Terms when none).
func (d *Decision) Chosen() Terms {
	if d.Index < 0 || d.Index >= len(d.Terms) {
		return Terms{}
	}
	return d.Terms[d.Index]
}

// Policy chooses a replica. Pick must not block or do I/O; it may keep state
// (guarded by itself) and must be safe for concurrent use. cands is not empty
// and Pick must not retain it.
type Policy interface {
	Pick(req *Request, cands []Candidate) Decision
}

// Evaluator is the optional part of a Policy that decides without changing
// any state: Evaluate returns the Decision Pick would make for the same
// arguments, except that it records nothing (no round-robin step, no trie
// insert) and draws no randomness: where Pick would choose at random among
// equally loaded tied candidates, Evaluate takes the one with the most
// confirmed cached blocks (held by the engine, not merely predicted: the
// choice whose cached-token estimate is most certain), then the first in
// candidate order; the Reason still says "tie_random". Random's Evaluate
// and prefix_chars' random pick among equal matches take the first
// candidate. Every policy of this package implements it. Evaluate must be
// safe for concurrent use with Pick.
type Evaluator interface {
	Evaluate(req *Request, cands []Candidate) Decision
}

// EvaluatePolicy returns p.Evaluate(req, cands) when p is an Evaluator and
// p.Pick(req, cands) otherwise (which may change p's state).
func EvaluatePolicy(p Policy, req *Request, cands []Candidate) Decision {
	if e, ok := p.(Evaluator); ok {
		return e.Evaluate(req, cands)
	}
	return p.Pick(req, cands)
}

// lockedRand is a *rand.Rand shared by concurrent Picks.
type lockedRand struct {
	mu sync.Mutex
	r  *rand.Rand
}

func (l *lockedRand) IntN(n int) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.r.IntN(n)
}

func newDecision(policy string, cands []Candidate) Decision {
	d := Decision{Policy: policy, Index: -1, Terms: make([]Terms, len(cands))}
	for i := range cands {
		d.Terms[i] = Terms{Name: cands[i].Name, CachedBlocks: cands[i].Match.Blocks()}
	}
	return d
}

// choose sets the decision's pick.
func (d *Decision) choose(i int, cands []Candidate, reason string) Decision {
	d.Index, d.Name, d.Reason = i, cands[i].Name, reason
	return *d
}
