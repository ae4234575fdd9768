package routing

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"time"
)

// Config configures a Router and its policy. A zero field means the default
// named in its comment; DefaultConfig fills them in.
type Config struct {
	// Policy is the policy name (see NewPolicy). Default "kv".
	Policy string `yaml:"policy"`
	// BlockSize is used when the index does not tell its block size, in
	// tokens. Default 16.
	BlockSize int `yaml:"block_size"`
	// PrefillRate and DecodeRate are each replica's throughput in tokens/s
	// until SetRates or learning (LearnRates) changes them. Defaults
	// 10,000 and 2,000.
	PrefillRate float64 `yaml:"prefill_rate"`
	DecodeRate  float64 `yaml:"decode_rate"`
	// LearnRates learns each replica's rates from its engine's counters
	// (Router.ObserveRates). By default it learns the rates left unset
	// above; one set explicitly stays as set.
	LearnRates RateLearning `yaml:"learn_rates"`
	// DefaultMaxTokens is the expected output length when a request gives
	// none, in tokens. Default 256.
	DefaultMaxTokens int `yaml:"default_max_tokens"`
	// GaugeMaxAge is how long scraped engine gauges stay valid. Default 10s.
	GaugeMaxAge time.Duration `yaml:"gauge_max_age"`
	// Routers is the number of kvrouter replicas in front of the same
	// engines and RouterIndex this one's place among them, 0..Routers-1
	// (e.g. a StatefulSet ordinal). With Routers > 1 the engines, in name
	// order, are dealt to the router replicas in turn (stripes), and each
	// replica breaks ties and near-ties towards its own stripe (see
	// Candidate.Stripe and KVConfig.StripeSlack). Nothing is exchanged:
	// a replica that is down only leaves its stripe to the others' normal
	// choices. Default 1 and 0: no stripes. Router.SetStripes changes
	// both while routing (kvrouter serve's peers block: from the router
	// Pods in Kubernetes).
	Routers     int `yaml:"routers"`
	RouterIndex int `yaml:"router_index"`

	KV          KVConfig          `yaml:"kv"`
	Dynamo      DynamoConfig      `yaml:"dynamo"`
	LLMD        LLMDConfig        `yaml:"llmd"`
	SGLang      SGLangConfig      `yaml:"sglang"`
	PrefixChars PrefixCharsConfig `yaml:"prefix_chars"`
	// SessionFallback is the policy for requests without a session key
	// under the session policy. Default "kv".
	SessionFallback string `yaml:"session_fallback"`

	// Now is the clock (time.Now when nil).
	Now func() time.Time `yaml:"-"`
	// Rand is the random source for random choices and tie-breaks (seeded
	// from the clock when nil).
	Rand *rand.Rand `yaml:"-"`
}

// KVConfig weighs the kv policy's cost (see the package doc).
type KVConfig struct {
	// GPUWeight, CPUWeight, StorageWeight and PredictedWeight weigh leading
	// blocks by tier. Defaults 1, 0.75, 0.25, 1. A weight below 0 means 0.
	GPUWeight       float64 `yaml:"gpu_weight"`
	CPUWeight       float64 `yaml:"cpu_weight"`
	StorageWeight   float64 `yaml:"storage_weight"`
	PredictedWeight float64 `yaml:"predicted_weight"`
	// CreditDecay is the backlog difference, in seconds, over which a
	// busier replica's cache credit falls by a factor e. Default 2s;
	// negative disables decay (full credit, as Dynamo).
	CreditDecay time.Duration `yaml:"credit_decay"`
	// DecodeWeight weighs running decode tokens / decode rate. Default 0.1;
	// negative means 0.
	DecodeWeight float64 `yaml:"decode_weight"`
	// WaitingPenalty is seconds added per request waiting in the engine
	// (fresh gauges only). Default 0.05s; negative means 0.
	WaitingPenalty time.Duration `yaml:"waiting_penalty"`
	// AffinitySlack keeps a conversation's turns together unless the
	// queueing cost is real: the candidate with the largest overlap wins
	// when it costs at most this much more (seconds) than the cheapest and
	// holds at least half the prompt more than every other candidate (its
	// own continuation: a prefix another replica also holds, such as a
	// shared system prompt, buys no stickiness). Default 2s; negative
	// means off.
	AffinitySlack time.Duration `yaml:"affinity_slack"`
	// AffinitySessions is how many conversations (Request.SessionKey) kv
	// remembers the last replica of (the conversation's home), oldest
	// forgotten first. A request of a remembered conversation stays home
	// while home holds more of its prompt than every other candidate (what
	// home holds beyond the others is its own history, however short beside
	// a shared system prompt; a home that has kept no more than another
	// candidate holds none of it, and the cost decides), within
	// AffinitySlack, without AffinityLoadCap, and beyond the slack when
	// every cheaper candidate would have to evict to take it (Terms.Evict
	// > 0). For a conversation kv has not seen, what any replica holds is
	// shared (a system prompt) and buys no stickiness; SessionSpread
	// places it. Requests without a session key
	// keep the half-prompt rule and the load cap. Default 65,536; negative
	// means off (the half-prompt rule for every request).
	AffinitySessions int `yaml:"affinity_sessions"`
	// SessionSpread sends a conversation's first request (a session key kv
	// does not remember, AffinitySessions) to the candidate with the
	// fewest remembered conversations among those costing at most this much
	// more than the cheapest: conversations grow on the replica of their
	// first turn, so spreading them spreads the caches' future load, where
	// cost alone sends them to the holder of their shared system prompt.
	// Default 500ms; negative means off.
	SessionSpread time.Duration `yaml:"session_spread"`
	// EvictWeight weighs kv's cache pressure: the blocks a placement
	// writes beyond the replica's free room (Capacity - Held) push out as
	// many blocks of its cache, each costed at block_size/prefill_rate
	// seconds (the candidates' mean rate) times this weight (what
	// recomputing it later would take). A
	// conversation (a request with a session key) is charged for its whole
	// prompt growing once more on the replica (its next turn needs it
	// there), so that new conversations go to replicas with room instead
	// of piling onto the holder of a shared prefix whose cache is full.
	// Replicas of unknown capacity are never charged. Default 1; negative
	// means off.
	EvictWeight float64 `yaml:"evict_weight"`
	// AffinityLoadCap bounds the slack's winner by load: it must have at
	// most AffinityLoadCap times the other candidates' mean in-flight
	// requests, plus one. A prefix only one replica holds, wanted by every
	// client, then spreads once that replica carries twice what the others
	// do on average (with two replicas: two thirds of the requests).
	// Default 2; negative means no cap.
	AffinityLoadCap float64 `yaml:"affinity_load_cap"`
	// EmptyHomeSlack keeps a remembered conversation none of whose prompt
	// any candidate holds (its home has evicted all of it, as when the
	// fleet's caches cannot hold every live conversation) on its home
	// while home costs at most this much more (seconds) than the cheapest
	// and every cheaper candidate would have to evict to take it
	// (Terms.Evict > 0). Every candidate would compute the whole prompt,
	// so only load tells them apart, and moving the conversation from one
	// full cache to another on a small difference of load, or at random
	// among equal costs, reshuffles which conversations share each cache:
	// on shared_prefix with 4 replicas of 2,000 blocks that cost kv
	// 0.15-0.22 point of hit rate against session affinity
	// (docs/results/2026-12-06-routing-sweep-3.md). A cheaper candidate
	// with room (a replica just added, or an index that has lost its
	// events) still takes it, and a home that holds some of the prompt
	// but no more than another candidate is not kept: the cost decides.
	// Default 100ms; negative means off.
	EmptyHomeSlack time.Duration `yaml:"empty_home_slack"`
	// StripeSlack, with Config.Routers > 1, sends a request to the
	// candidate of the lowest stripe rank (this router's own stripe first)
	// among those costing at most this much more than the cheapest, unless
	// the affinity slack chose already: near-equal costs come from signals
	// every router replica shares (the engines' events and gauges), so
	// replicas deciding at the same moment would otherwise all choose the
	// same engine. Candidates holding an eighth of the prompt less than the
	// cheapest are left out. Default 1s; negative means off. No effect with one
	// router.
	StripeSlack time.Duration `yaml:"stripe_slack"`
}

// DynamoConfig is NVIDIA Dynamo's KV router cost.
type DynamoConfig struct {
	// OverlapWeight is Dynamo's --kv-overlap-score-weight. Default 1.
	OverlapWeight float64 `yaml:"overlap_weight"`
}

// LLMDConfig is llm-d's default scorer weights.
type LLMDConfig struct {
	// QueueWeight, KVUsageWeight and PrefixWeight weigh the queue-scorer,
	// kv-cache-utilization-scorer and prefix-cache-scorer. Defaults 2, 2, 3.
	QueueWeight   float64 `yaml:"queue_weight"`
	KVUsageWeight float64 `yaml:"kv_usage_weight"`
	PrefixWeight  float64 `yaml:"prefix_weight"`
}

// SGLangConfig is sglang router's cache_aware policy.
type SGLangConfig struct {
	// CacheThreshold is the prefix match rate above which the best-matching
	// worker is chosen. Default 0.3.
	CacheThreshold float64 `yaml:"cache_threshold"`
	// BalanceAbsThreshold and BalanceRelThreshold: the fleet is imbalanced
	// when max-min load > abs and max > rel*min. Defaults 64 and 1.5.
	BalanceAbsThreshold int     `yaml:"balance_abs_threshold"`
	BalanceRelThreshold float64 `yaml:"balance_rel_threshold"`
}

// PrefixCharsConfig is production-stack's prefix-aware router.
type PrefixCharsConfig struct {
	// ChunkSize is the trie's chunk length in characters (Unicode code
	// points). Default 128.
	ChunkSize int `yaml:"chunk_size"`
	// MaxNodes bounds the trie; it is emptied when full. Default 1,000,000.
	MaxNodes int `yaml:"max_nodes"`
}

// DefaultConfig returns cfg with every zero field set to its default.
func DefaultConfig(cfg Config) Config {
	def := func(p *float64, v float64) {
		if *p == 0 {
			*p = v
		}
	}
	if cfg.Policy == "" {
		cfg.Policy = "kv"
	}
	if cfg.BlockSize == 0 {
		cfg.BlockSize = 16
	}
	cfg.LearnRates = cfg.LearnRates.resolve(cfg.PrefillRate != 0, cfg.DecodeRate != 0)
	def(&cfg.PrefillRate, 10000)
	def(&cfg.DecodeRate, 2000)
	if cfg.DefaultMaxTokens == 0 {
		cfg.DefaultMaxTokens = 256
	}
	if cfg.GaugeMaxAge == 0 {
		cfg.GaugeMaxAge = 10 * time.Second
	}
	def(&cfg.KV.GPUWeight, 1)
	def(&cfg.KV.CPUWeight, 0.75)
	def(&cfg.KV.StorageWeight, 0.25)
	def(&cfg.KV.PredictedWeight, 1)
	if cfg.KV.CreditDecay == 0 {
		cfg.KV.CreditDecay = 2 * time.Second
	}
	def(&cfg.KV.DecodeWeight, 0.1)
	if cfg.KV.AffinitySlack == 0 {
		cfg.KV.AffinitySlack = 2 * time.Second
	}
	def(&cfg.KV.AffinityLoadCap, 2)
	def(&cfg.KV.EvictWeight, 1)
	if cfg.KV.EmptyHomeSlack == 0 {
		cfg.KV.EmptyHomeSlack = 100 * time.Millisecond
	}
	if cfg.KV.SessionSpread == 0 {
		cfg.KV.SessionSpread = 500 * time.Millisecond
	}
	if cfg.KV.AffinitySessions == 0 {
		cfg.KV.AffinitySessions = 1 << 16
	}
	if cfg.KV.StripeSlack == 0 {
		cfg.KV.StripeSlack = time.Second
	}
	if cfg.KV.WaitingPenalty == 0 {
		cfg.KV.WaitingPenalty = 50 * time.Millisecond
	}
	def(&cfg.Dynamo.OverlapWeight, 1)
	def(&cfg.LLMD.QueueWeight, 2)
	def(&cfg.LLMD.KVUsageWeight, 2)
	def(&cfg.LLMD.PrefixWeight, 3)
	def(&cfg.SGLang.CacheThreshold, 0.3)
	if cfg.SGLang.BalanceAbsThreshold == 0 {
		cfg.SGLang.BalanceAbsThreshold = 64
	}
	def(&cfg.SGLang.BalanceRelThreshold, 1.5)
	if cfg.PrefixChars.ChunkSize == 0 {
		cfg.PrefixChars.ChunkSize = 128
	}
	if cfg.PrefixChars.MaxNodes == 0 {
		cfg.PrefixChars.MaxNodes = 1_000_000
	}
	if cfg.SessionFallback == "" {
		cfg.SessionFallback = "kv"
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Rand == nil {
		seed := uint64(time.Now().UnixNano())
		cfg.Rand = rand.New(rand.NewPCG(seed, seed>>1|1))
	}
	return cfg
}

func (cfg Config) validate() error {
	var errs []error
	if cfg.BlockSize < 0 {
		errs = append(errs, fmt.Errorf("block_size %d: must be positive", cfg.BlockSize))
	}
	if err := cfg.LearnRates.validate(); err != nil {
		errs = append(errs, err)
	}
	if cfg.PrefillRate < 0 || cfg.DecodeRate < 0 {
		errs = append(errs, fmt.Errorf("prefill_rate %v, decode_rate %v: must be positive", cfg.PrefillRate, cfg.DecodeRate))
	}
	if cfg.Routers < 0 || cfg.RouterIndex < 0 || (cfg.RouterIndex > 0 && cfg.RouterIndex >= cfg.Routers) {
		errs = append(errs, fmt.Errorf("routers %d, router_index %d: want 0 <= router_index < routers", cfg.Routers, cfg.RouterIndex))
	}
	if cfg.GaugeMaxAge < 0 {
		errs = append(errs, fmt.Errorf("gauge_max_age %v: must be positive", cfg.GaugeMaxAge))
	}
	if cfg.PrefixChars.ChunkSize < 0 {
		errs = append(errs, fmt.Errorf("prefix_chars.chunk_size %d: must be positive", cfg.PrefixChars.ChunkSize))
	}
	if cfg.SessionFallback == "session" {
		errs = append(errs, errors.New("session_fallback: must not be session"))
	}
	return errors.Join(errs...)
}

// ErrUnknownPolicy is returned by NewPolicy and New for a policy name not in
// Policies.
var ErrUnknownPolicy = errors.New("unknown routing policy")

// Policies lists the policy names NewPolicy accepts.
func Policies() []string {
	return []string{"kv", "random", "round_robin", "least_load", "session", "prefix_chars", "dynamo", "llmd", "sglang"}
}

// NewPolicy returns the named policy configured by cfg (after
// DefaultConfig). The error wraps ErrUnknownPolicy for an unknown name.
func NewPolicy(name string, cfg Config) (Policy, error) {
	cfg = DefaultConfig(cfg)
	rng := &lockedRand{r: cfg.Rand}
	switch name {
	case "kv":
		return newKV(cfg, rng), nil
	case "random":
		return &Random{rng: rng}, nil
	case "round_robin":
		return &RoundRobin{}, nil
	case "least_load":
		return &LeastLoad{rng: rng}, nil
	case "session":
		fb, err := NewPolicy(cfg.SessionFallback, cfg)
		if err != nil {
			return nil, fmt.Errorf("session fallback: %w", err)
		}
		return &Session{Fallback: fb}, nil
	case "prefix_chars":
		return newPrefixChars(cfg.PrefixChars, rng), nil
	case "dynamo":
		return &Dynamo{cfg: cfg.Dynamo, blockSize: cfg.BlockSize, rng: rng}, nil
	case "llmd":
		return &LLMD{cfg: cfg.LLMD, blockSize: cfg.BlockSize, rng: rng}, nil
	case "sglang":
		return &SGLang{cfg: cfg.SGLang, blockSize: cfg.BlockSize, rng: rng}, nil
	}
	return nil, fmt.Errorf("%w %q (known: %v)", ErrUnknownPolicy, name, Policies())
}
