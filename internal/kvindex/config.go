package kvindex

import (
	"errors"
	"fmt"
	"time"
)

// Config configures an Exact or Approx index. A zero field means the default
// named in its comment; DefaultConfig fills them in.
type Config struct {
	// Model and Pool name the key space (see Root). Two indexes with
	// different Model or Pool never share keys.
	Model string `yaml:"model"`
	Pool  string `yaml:"pool"`
	// BlockSize is the engines' KV block size in tokens (vLLM's block_size
	// from events or vllm:cache_config_info). Default 16. Exact skips
	// BlockStored events of another size (Stats.Mismatched).
	BlockSize int `yaml:"block_size"`
	// MaxEntries caps the (block, engine rank) entries of Exact and the
	// (block, replica) entries of Approx; the least recent are evicted
	// (Exact: approximately, by CLOCK; see the package doc).
	// Default 8,388,608 (about 0.5 GB); at most 2^30.
	MaxEntries int `yaml:"max_entries"`
	// ExpectedEntries sizes the key table up front for this many entries
	// (at most one key each), e.g. the sum of the fleet's num_gpu_blocks
	// over engines and ranks, so that a filling index does not rehash the
	// table each time it doubles (a one-time cost of a fresh index: sized,
	// the fresh Mooncake replay runs about 8 % faster, see docs/routing.md;
	// the entry slab and per-engine tables still grow). It costs
	// 5 bytes per slot, 6.7 to 13.3 bytes per expected entry, allocated at
	// creation. Default 0: the table grows on demand. At most MaxEntries.
	ExpectedEntries int `yaml:"expected_entries"`
	// PredictTTL is how long Exact counts a routed request's blocks for
	// the chosen replica before a BlockStored confirms them. Default 5s;
	// negative disables prediction.
	PredictTTL time.Duration `yaml:"predict_ttl"`
	// MaxPredicted caps the keys predictions hold: a routed request's
	// blocks after those its replica held, plus one, oldest requests dropped
	// first (8 bytes a key). Default 1,048,576. Independently, at most
	// 16,384 requests' predictions are kept.
	MaxPredicted int `yaml:"max_predicted"`
	// ApproxTTL is an optional upper bound on how long Approx keeps a
	// block after it was last routed. Default 0: none, blocks leave only
	// when the replica's capacity (ApproxCapacity, SetCapacity) is full,
	// least recently routed first, as the engine's prefix cache evicts
	// (vLLM keeps a freed block until its free-block queue reaches it,
	// however long ago that was). A fixed window (Dynamo's
	// ApproxKvIndexer uses 120 s) forgets prompts the engine still holds.
	ApproxTTL time.Duration `yaml:"approx_ttl"`
	// ApproxCapacity is the per-replica capacity of Approx in blocks until
	// SetCapacity gives the engine's num_gpu_blocks. Default 65,536.
	ApproxCapacity int `yaml:"approx_capacity"`
	// Now is the clock (time.Now when nil); inject a virtual one to simulate.
	Now func() time.Time `yaml:"-"`
}

// Defaults used by DefaultConfig.
const (
	DefaultBlockSize      = 16
	DefaultMaxEntries     = 1 << 23
	DefaultPredictTTL     = 5 * time.Second
	DefaultMaxPredicted   = 1 << 20
	DefaultApproxCapacity = 1 << 16
)

// DefaultConfig returns cfg with every zero field set to its default.
func DefaultConfig(cfg Config) Config {
	if cfg.BlockSize == 0 {
		cfg.BlockSize = DefaultBlockSize
	}
	if cfg.MaxEntries == 0 {
		cfg.MaxEntries = DefaultMaxEntries
	}
	if cfg.PredictTTL == 0 {
		cfg.PredictTTL = DefaultPredictTTL
	}
	if cfg.MaxPredicted == 0 {
		cfg.MaxPredicted = DefaultMaxPredicted
	}
	if cfg.ApproxCapacity == 0 {
		cfg.ApproxCapacity = DefaultApproxCapacity
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return cfg
}

func (cfg Config) validate() error {
	var errs []error
	if cfg.BlockSize < 0 {
		errs = append(errs, fmt.Errorf("block_size %d: must be positive", cfg.BlockSize))
	}
	if cfg.MaxEntries < 0 || cfg.MaxEntries > 1<<30 {
		// Entry indices share 32 bits with the holder-record tag.
		errs = append(errs, fmt.Errorf("max_entries %d: must be in 1..2^30", cfg.MaxEntries))
	}
	if cfg.ExpectedEntries < 0 || cfg.ExpectedEntries > cfg.MaxEntries {
		errs = append(errs, fmt.Errorf("expected_entries %d: must be in 0..max_entries", cfg.ExpectedEntries))
	}
	if cfg.MaxPredicted < 0 || cfg.MaxPredicted > 1<<31 {
		errs = append(errs, fmt.Errorf("max_predicted %d: must be in 1..2^31", cfg.MaxPredicted))
	}
	if cfg.ApproxTTL < 0 {
		errs = append(errs, fmt.Errorf("approx_ttl %v: must not be negative (0: no bound)", cfg.ApproxTTL))
	}
	if cfg.ApproxCapacity < 0 {
		errs = append(errs, fmt.Errorf("approx_capacity %d: must be positive", cfg.ApproxCapacity))
	}
	return errors.Join(errs...)
}

// Stats are an index's counters since New. Counts of events and blocks are
// cumulative; Entries, Keys, Replicas, Bytes and PredictedLive are current.
type Stats struct {
	Entries  int64 // (block, engine rank) entries (Approx: (block, replica))
	Keys     int64 // distinct keys
	Replicas int64 // replicas registered
	Bytes    int64 // memory held by the index's tables

	Batches        int64 // batches applied
	Stored         int64 // blocks newly stored (entries created)
	Duplicates     int64 // extra copies of a block already held (reference count +1)
	HitReports     int64 // blocks refreshed by hit reports (no copy added)
	Removed        int64 // blocks removed (entries deleted)
	Cleared        int64 // entries dropped by AllBlocksCleared, Reset or RemoveReplica
	Evicted        int64 // entries evicted by MaxEntries (Approx: capacity, TTL)
	UnknownParent  int64 // BlockStored events skipped: parent hash never stored
	UnknownRemoved int64 // BlockRemoved hashes not in the index
	Mismatched     int64 // BlockStored events skipped: block size or token count wrong, bad extra keys
	OtherGroups    int64 // BlockStored events skipped: not a full-attention group

	Predicted     int64 // predicted (block, replica) pairs created
	Confirmed     int64 // predictions confirmed by a BlockStored of that replica
	Expired       int64 // predictions that expired or were evicted unconfirmed
	Cancelled     int64 // predictions dropped by Exact.Cancel (the engine answered with an error)
	PredictedLive int64 // predictions currently held
}

// ConfirmationRate returns Confirmed / (Confirmed + Expired), the share of
// settled predictions that the chosen engine reported stored, or 0 when none
// settled yet.
func (s Stats) ConfirmationRate() float64 {
	if d := s.Confirmed + s.Expired; d > 0 {
		return float64(s.Confirmed) / float64(d)
	}
	return 0
}
