package enginesim

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"kvrouter/internal/vllm"
)

// Errors Submit returns; callers branch on them to pick an HTTP status.
var (
	// ErrInvalidRequest: empty prompt, MaxTokens < 1, or a prompt plus
	// MaxTokens longer than MaxModelLen.
	ErrInvalidRequest = errors.New("invalid request")
	// ErrDuplicateID: a request with this ID is already in the engine.
	ErrDuplicateID = errors.New("duplicate request id")
)

// Request is one generation request as the engine core sees it.
type Request struct {
	// ID is unique among the requests in the engine.
	ID string
	// Tokens is the prompt. The Core copies it; the caller may reuse it.
	Tokens []uint32
	// MaxTokens is the exact number of tokens generated (the simulator never
	// stops early, as if ignore_eos were set). At least 1.
	MaxTokens int
	// LoRAName is the adapter name, part of every block's extra keys.
	LoRAName string
	// CacheSalt is the cache_salt request field, part of block 0's extra keys.
	CacheSalt string
	// MM are the prompt's multimodal items (identifier and placeholder
	// range), sorted by offset, not overlapping, inside Tokens: extra keys
	// of the blocks they overlap (vllm.BlockExtraKeys), as vLLM keys a
	// request's mm_features.
	MM []vllm.MMFeature
	// ReportHits asks for vllm_xargs.kv_cache_report_mode "full": every
	// admission that reuses cached GPU blocks emits a BlockStored with a nil
	// parent for those blocks.
	ReportHits bool
	// RemoteKV marks a decode-side request of disaggregated serving
	// (kv_transfer_params.do_remote_prefill): its prompt's KV is pulled
	// from a prefill engine instead of computed (see pdcore.go).
	RemoteKV bool
	// RemoteDecode marks a prefill-side request
	// (kv_transfer_params.do_remote_decode): its last Output carries the
	// request's block ids (Output.BlockIDs) for the decode engine to pull.
	RemoteDecode bool
}

// Output is one token a request produced in a step.
type Output struct {
	// ID is the request's ID.
	ID string
	// Token is the generated token id; Index its position in the output
	// (0 for the first token).
	Token uint32
	Index int
	// Finished is set on the last token; FinishReason is then "length".
	Finished     bool
	FinishReason string
	// PromptTokens is the prompt length; CachedTokens the prompt tokens
	// found in the cache (GPU or CPU tier) at the request's first
	// admission, vLLM's num_cached_tokens and usage cached_tokens.
	PromptTokens int
	CachedTokens int
	// PrefillTime and DecodeTime are set on the last token: from the
	// step of the first admission to the end of the step of the first
	// token, and from there to the end of this step, on the timing model's
	// clock (vLLM's FinishedRequestStats.prefill_time and decode_time,
	// vllm/v1/metrics/stats.py).
	PrefillTime, DecodeTime time.Duration
	// BlockIDs are the request's KV block ids at its end, set on the last
	// Output of a Request.RemoteDecode request only (vLLM's
	// kv_transfer_params.remote_block_ids).
	BlockIDs []int32
}

// StepResult is what one Step did. Outputs and Events are owned by the Core
// and valid until the next Step; the slices inside Events are never written
// again (some share a read-only backing array) and may be kept, read-only.
type StepResult struct {
	// Duration is how long the step takes under the timing model; zero when
	// nothing was scheduled.
	Duration time.Duration
	// Outputs are the tokens produced, in scheduling order.
	Outputs []Output
	// Events are the KV events of this step plus any produced between the
	// previous Step and this one (ResetPrefixCache), in order; vLLM
	// publishes them as one batch at the end of the step.
	Events []vllm.Event
	// Scheduled, PrefillTokens, DecodeSeqs and LoadedTokens are the step's
	// batch: sequences scheduled, uncached prompt tokens computed, decoding
	// sequences, tokens reloaded from the CPU tier.
	Scheduled, PrefillTokens, DecodeSeqs, LoadedTokens int
	// Preempted is the number of sequences preempted in this step.
	Preempted int
	// Transfers are the KV pulls of Request.RemoteKV requests admitted in
	// this step: the owner waits each one's transfer time and then calls
	// Received (pdcore.go).
	Transfers []Transfer
}

// Stats are a Core's cumulative counters since NewCore.
type Stats struct {
	// PrefixQueries and PrefixHits are vLLM's prefix_cache_queries and
	// prefix_cache_hits in tokens (GPU cache only), counted at every
	// admission, including re-admissions after preemption.
	PrefixQueries, PrefixHits int64
	// ExternalQueries and ExternalHits count the CPU tier the same way:
	// queried tokens beyond the GPU hit, and tokens reloaded.
	ExternalQueries, ExternalHits int64
	// Preemptions counts sequences preempted by recompute.
	Preemptions int64
	// PromptTokens and GenerationTokens count tokens of admitted prompts
	// (first admission only) and generated tokens.
	PromptTokens, GenerationTokens int64
	// PrefillComputedTokens counts prompt tokens computed in prefill steps
	// (recomputation after preemption included; the sum of vLLM's
	// request_prefill_kv_computed_tokens up to that).
	PrefillComputedTokens int64
	// PrefillSeconds and DecodeSeconds sum Output.PrefillTime and
	// DecodeTime over finished requests (vLLM's
	// request_prefill_time_seconds and request_decode_time_seconds _sum).
	PrefillSeconds, DecodeSeconds float64
	// Finished and Aborted count requests.
	Finished, Aborted int64
	// Steps counts steps that scheduled anything.
	Steps int64
	// RemoteTokens counts prompt tokens whose KV was pulled from a prefill
	// engine (Request.RemoteKV) instead of computed.
	RemoteTokens int64
}

// seqStatus is where a sequence is.
type seqStatus uint8

const (
	statusWaiting seqStatus = iota
	statusRunning
)

// seq is a request inside the core (vLLM's Request).
type seq struct {
	id         string
	tokens     []uint32 // prompt then generated tokens
	promptLen  int
	maxTokens  int
	lora       *string
	loraKeys   []any // []any{lora} shared by blocks > 0
	mm         []vllm.MMFeature
	salt       string
	reportHits bool
	// remote: the prompt's KV is still to be pulled (Request.RemoteKV);
	// cleared once received. remoteDecode: Request.RemoteDecode.
	remote, remoteDecode bool
	// seed is the FNV-1a state over the first seedLen prompt tokens; it is
	// folded block by block as the blocks are hashed (see foldSeed) and is
	// the output-token seed once seedLen == promptLen.
	seed    uint64
	seedLen int

	status   seqStatus
	computed int // num_computed_tokens
	blocks   []int32
	// numCached is how many of blocks are registered in the cache.
	numCached int
	hashes    []vllm.BlockHash
	lastHash  []byte // digest of hashes[len-1]
	// cachedTokens is num_cached_tokens, set at the first admission (-1 before).
	cachedTokens int
	// scheduledAt and firstTokenAt are Core.busy at the start of the step
	// of the first admission and at the end of the step of the first
	// token (vLLM's scheduled_ts and first_token_ts).
	scheduledAt, firstTokenAt time.Duration
}

func (s *seq) numTokens() int { return len(s.tokens) }
func (s *seq) generated() int { return len(s.tokens) - s.promptLen }

// Core is a simulated vLLM engine core: prefix cache, scheduler and timing
// model, advanced one step at a time by its owner. It starts no goroutines
// and reads no clock. It is not safe for concurrent use.
type Core struct {
	cfg     CoreConfig
	hasher  BlockHasher
	pool    *blockPool
	cpu     *cpuTier
	waiting deque
	running []*seq
	byID    map[string]*seq
	loraIDs map[string]int64
	stats   Stats
	// busy is the sum of all step durations so far: the timing model's
	// clock, which stands still while the Core is idle.
	busy time.Duration
	// receiving counts requests waiting for their remote KV (pdcore.go).
	receiving int

	group0 *int
	kind   *string

	// per-step scratch
	outs      []Output
	pending   []vllm.Event
	spare     []vllm.Event
	scheduled []scheduledSeq
	hits      []int32
	parentBuf []byte // PrefixHashes' chained digest

	// Event slabs: BlockRemoved hashes are carved one by one from
	// removedSlab (each element written once, a fresh slab when it runs
	// out); plain BlockStored events share prefixes of noKeys, all nil and
	// never written.
	removedSlab []vllm.BlockHash
	noKeys      [][]any
}

type scheduledSeq struct {
	s      *seq
	n      int
	decode bool
}

// NewCore checks cfg (every problem at once), fills in defaults and returns
// an idle Core.
func NewCore(cfg CoreConfig) (*Core, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("enginesim: core config: %w", err)
	}
	c := &Core{
		cfg:     cfg,
		hasher:  cfg.Hasher,
		pool:    newBlockPool(cfg.NumGPUBlocks, cfg.NumCPUBlocks > 0 && !cfg.NoEvents),
		byID:    make(map[string]*seq),
		loraIDs: make(map[string]int64),
		group0:  new(int),
		kind:    new(string),
	}
	*c.kind = vllm.FullAttention
	if c.hasher == nil {
		c.hasher = NewFastHasher(cfg.HashSeed)
	}
	if cfg.NumCPUBlocks > 0 {
		c.cpu = newCPUTier(cfg.NumCPUBlocks)
	}
	c.pool.onEvict = c.evicted
	return c, nil
}

// Config returns the effective configuration (defaults filled in).
func (c *Core) Config() CoreConfig { return c.cfg }

// Submit queues r at the back of the waiting queue. It returns
// ErrInvalidRequest or ErrDuplicateID (wrapped) and leaves the Core
// unchanged on error.
func (c *Core) Submit(r *Request) error {
	switch {
	case len(r.Tokens) == 0:
		return fmt.Errorf("%w: empty prompt", ErrInvalidRequest)
	case r.MaxTokens < 1:
		return fmt.Errorf("%w: max_tokens must be at least 1, got %d", ErrInvalidRequest, r.MaxTokens)
	case len(r.Tokens)+r.MaxTokens > c.cfg.MaxModelLen:
		return fmt.Errorf("%w: %d prompt tokens + %d max_tokens > max_model_len %d",
			ErrInvalidRequest, len(r.Tokens), r.MaxTokens, c.cfg.MaxModelLen)
	}
	if err := checkMM(r.MM, len(r.Tokens)); err != nil {
		return err
	}
	if _, dup := c.byID[r.ID]; dup {
		return fmt.Errorf("%w: %q", ErrDuplicateID, r.ID)
	}
	s := &seq{
		id:           r.ID,
		promptLen:    len(r.Tokens),
		maxTokens:    r.MaxTokens,
		salt:         r.CacheSalt,
		reportHits:   r.ReportHits,
		remote:       r.RemoteKV,
		remoteDecode: r.RemoteDecode,
		cachedTokens: -1,
		mm:           slices.Clone(r.MM),
	}
	// Copy the prompt with room for the output: appending the room (at
	// least one token, as MaxTokens >= 1) as zeros to a capacity-capped view
	// makes one new allocation whose prompt part is copied, not zeroed first.
	n := len(r.Tokens)
	s.tokens = append(r.Tokens[:n:n], make([]uint32, min(r.MaxTokens, 4096))...)[:n]
	s.hashes = make([]vllm.BlockHash, 0, cap(s.tokens)/c.cfg.BlockSize)
	s.seed = fnvOffset
	if r.LoRAName != "" {
		name := r.LoRAName
		s.lora = &name
		s.loraKeys = []any{name}
		if _, ok := c.loraIDs[name]; !ok {
			c.loraIDs[name] = int64(len(c.loraIDs) + 1)
		}
	}
	c.byID[r.ID] = s
	c.waiting.pushBack(s)
	return nil
}

// Abort removes a waiting or running request and frees its blocks (kept in
// the cache, as vLLM frees a finished request's blocks). It reports whether
// the request was in the engine.
func (c *Core) Abort(id string) bool {
	s, ok := c.byID[id]
	if !ok {
		return false
	}
	delete(c.byID, id)
	c.stats.Aborted++
	if s.status == statusWaiting {
		c.waiting.remove(s)
		return true
	}
	if s.status == statusReceiving {
		c.receiving--
	}
	for i, r := range c.running {
		if r == s {
			c.running = append(c.running[:i], c.running[i+1:]...)
			break
		}
	}
	c.release(s)
	return true
}

// ResetPrefixCache drops every cached hash (GPU and CPU tier) and queues one
// AllBlocksCleared event for the next Step, as vLLM's reset_prefix_cache.
// Like vLLM it refuses, returning false, while any request holds blocks.
func (c *Core) ResetPrefixCache() bool {
	if !c.pool.reset() {
		return false
	}
	if c.cpu != nil {
		c.cpu.reset()
	}
	if !c.cfg.NoEvents {
		c.pending = append(c.pending, vllm.Event{Type: vllm.AllBlocksCleared})
	}
	return true
}

// Idle reports whether no request is waiting or running.
func (c *Core) Idle() bool { return len(c.running) == 0 && c.waiting.len() == 0 }

// Waiting is the number of waiting requests (vllm:num_requests_waiting).
func (c *Core) Waiting() int { return c.waiting.len() }

// Running is the number of running requests (vllm:num_requests_running).
func (c *Core) Running() int { return len(c.running) }

// KVUsage is the fraction of usable GPU blocks held by requests, 0..1
// (vllm:kv_cache_usage_perc); cached but unreferenced blocks count as free.
func (c *Core) KVUsage() float64 { return c.pool.usage() }

// CachedBlocks is the number of GPU blocks holding a hash.
func (c *Core) CachedBlocks() int {
	n := 0
	for i := range c.pool.blocks {
		if c.pool.blocks[i].hashed {
			n++
		}
	}
	return n
}

// CPUBlocks is the number of blocks held by the CPU tier.
func (c *Core) CPUBlocks() int {
	if c.cpu == nil {
		return 0
	}
	return c.cpu.len()
}

// Stats returns the cumulative counters.
func (c *Core) Stats() Stats { return c.stats }

// release frees s's blocks, last block first.
func (c *Core) release(s *seq) {
	c.pool.freeReversed(s.blocks)
	s.blocks = s.blocks[:0]
	s.numCached = 0
}

// FNV-1a 64-bit parameters of the output-token seed.
const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

// foldSeed folds the prompt tokens before position upTo (at most the
// prompt's length) into s.seed: FNV-1a over the token values, so equal
// prompts give equal outputs. ensureHashes calls it block by block, where
// its serial multiply chain overlaps the block hashing; nextToken finishes
// the prompt's partial last block.
func (s *seq) foldSeed(upTo int) {
	upTo = min(upTo, s.promptLen)
	if upTo <= s.seedLen {
		return
	}
	h := s.seed
	for _, t := range s.tokens[s.seedLen:upTo] {
		h ^= uint64(t)
		h *= fnvPrime
	}
	s.seed, s.seedLen = h, upTo
}

// splitmix64 is a fast integer mixer for pseudo-random output tokens.
func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// nextToken is the deterministic output token at position i of s.
func (c *Core) nextToken(s *seq, i int) uint32 {
	s.foldSeed(s.promptLen)
	return uint32(splitmix64(s.seed+uint64(i)) % uint64(c.cfg.VocabSize))
}

// PrefixHashes appends to dst the block hashes of the full blocks of a
// plain prompt (no LoRA adapter, no cache_salt), chained as Submit's
// requests are hashed. Cores with equal BlockSize, HashSeed and hasher
// compute equal hashes, so one core's answer serves a whole fleet.
func (c *Core) PrefixHashes(dst []vllm.BlockHash, tokens []uint32) []vllm.BlockHash {
	bs := c.cfg.BlockSize
	var parent []byte
	for i := 0; (i+1)*bs <= len(tokens); i++ {
		d := c.hasher.HashBlock(parent, tokens[i*bs:(i+1)*bs], nil)
		c.parentBuf = append(c.parentBuf[:0], d...)
		parent = c.parentBuf
		dst = append(dst, vllm.EventValue(d))
	}
	return dst
}

// CachedPrefix is how many leading hashes are held by the GPU prefix cache
// now, including blocks cached by the step under way (vLLM caches blocks
// when it schedules them).
func (c *Core) CachedPrefix(hashes []vllm.BlockHash) int {
	for i, h := range hashes {
		if c.pool.lookup(h) == nilBlock {
			return i
		}
	}
	return len(hashes)
}
