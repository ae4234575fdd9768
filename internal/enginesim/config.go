package enginesim

import (
	"errors"
	"fmt"
	"time"
)

// Timing is the step-time model: one engine step that schedules p uncached
// prompt tokens, d decoding sequences and l tokens reloaded from the CPU tier
// lasts
//
//	StepOverhead + p/PrefillTokensPerSec + d*DecodePerSeq + l/CPULoadTokensPerSec
//
// Sequences recomputed after a preemption count as prefill. See
// docs/engine-sim.md for where the numbers of each profile come from.
type Timing struct {
	// StepOverhead is the fixed cost of a step that runs anything (weights
	// read once, scheduling, sampling).
	StepOverhead time.Duration `yaml:"step_overhead"`
	// PrefillTokensPerSec is the prefill throughput in tokens per second.
	PrefillTokensPerSec float64 `yaml:"prefill_tokens_per_sec"`
	// DecodePerSeq is the extra time each decoding sequence adds to a step.
	DecodePerSeq time.Duration `yaml:"decode_per_seq"`
	// CPULoadTokensPerSec is how fast KV is reloaded from the CPU tier, in
	// tokens per second (0 means 200,000).
	CPULoadTokensPerSec float64 `yaml:"cpu_load_tokens_per_sec"`
}

// Profiles are the named timing and capacity presets, selected by name with
// Profile. They are values, copied on lookup.
const (
	// ProfileH100 is Llama-3.1-8B in bf16 on one H100 SXM 80 GB (the default).
	ProfileH100 = "h100-llama3-8b"
	// ProfileA100 is Llama-3.1-8B in bf16 on one A100 SXM 80 GB.
	ProfileA100 = "a100-llama3-8b"
	// ProfileFast keeps the H100 profile's cache but makes steps ~100x
	// shorter, for tests and soaks on a real clock.
	ProfileFast = "fast"
)

// ProfileNames lists the profiles Profile knows, default first.
func ProfileNames() []string { return []string{ProfileH100, ProfileA100, ProfileFast} }

// Profile returns the named preset: its Timing and the cache size it implies
// (GPU blocks of 16 tokens). Unknown names return an error listing the known
// ones.
func Profile(name string) (Timing, int, error) {
	switch name {
	case ProfileH100, "":
		return Timing{
			StepOverhead:        6 * time.Millisecond,
			PrefillTokensPerSec: 20000,
			DecodePerSeq:        60 * time.Microsecond,
			CPULoadTokensPerSec: 200000,
		}, 27000, nil
	case ProfileA100:
		return Timing{
			StepOverhead:        9 * time.Millisecond,
			PrefillTokensPerSec: 8000,
			DecodePerSeq:        100 * time.Microsecond,
			CPULoadTokensPerSec: 150000,
		}, 27000, nil
	case ProfileFast:
		return Timing{
			StepOverhead:        50 * time.Microsecond,
			PrefillTokensPerSec: 2e6,
			DecodePerSeq:        500 * time.Nanosecond,
			CPULoadTokensPerSec: 2e7,
		}, 27000, nil
	}
	return Timing{}, 0, fmt.Errorf("unknown timing profile %q (known: %v)", name, ProfileNames())
}

// Defaults of CoreConfig's zero fields.
const (
	DefaultBlockSize           = 16     // vLLM's default --block-size on CUDA
	DefaultMaxNumSeqs          = 1024   // vLLM V1, OpenAI server, GPUs with >= 70 GiB
	DefaultMaxNumBatchedTokens = 8192   // idem
	DefaultMaxModelLen         = 131072 // Llama-3.1-8B's context
	DefaultVocabSize           = 128256 // Llama-3 vocabulary, for output token ids
)

// CoreConfig configures a Core. A zero field means the default in its comment.
type CoreConfig struct {
	// BlockSize is the KV block size in tokens (16).
	BlockSize int `yaml:"block_size"`
	// NumGPUBlocks is the GPU KV cache size in blocks, vLLM's
	// --num-gpu-blocks-override (the profile's value: 27,000). As in vLLM,
	// one block is the reserved null block, so NumGPUBlocks-1 are usable.
	NumGPUBlocks int `yaml:"num_gpu_blocks"`
	// NumCPUBlocks is the size of the CPU tier in blocks; 0 disables it.
	NumCPUBlocks int `yaml:"num_cpu_blocks"`
	// MaxNumSeqs caps running sequences per step (1024).
	MaxNumSeqs int `yaml:"max_num_seqs"`
	// MaxNumBatchedTokens is the token budget per step (8192). Prompts
	// longer than the budget are prefilled in chunks.
	MaxNumBatchedTokens int `yaml:"max_num_batched_tokens"`
	// MaxModelLen caps prompt plus output tokens (131072).
	MaxModelLen int `yaml:"max_model_len"`
	// Profile names the timing preset used for zero Timing fields and a zero
	// NumGPUBlocks (ProfileH100).
	Profile string `yaml:"profile"`
	// Timing overrides the profile field by field (zero fields keep the
	// profile's value).
	Timing Timing `yaml:"timing"`
	// VocabSize bounds the pseudo-random output token ids (128256).
	VocabSize int `yaml:"vocab_size"`
	// Hasher computes block hashes; nil means NewFastHasher(HashSeed).
	Hasher BlockHasher `yaml:"-"`
	// HashSeed seeds the default fast hasher (as PYTHONHASHSEED does
	// vLLM's); ignored when Hasher is set.
	HashSeed string `yaml:"hash_seed"`
	// NoEvents turns KV events off: Step returns none and blocks keep no
	// token references (cheaper for the fleet simulator).
	NoEvents bool `yaml:"no_events"`
}

// withDefaults returns cfg with zero fields filled in and checks it,
// returning every problem at once.
func (cfg CoreConfig) withDefaults() (CoreConfig, error) {
	t, blocks, err := Profile(cfg.Profile)
	if err != nil {
		return cfg, err
	}
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&cfg.BlockSize, DefaultBlockSize)
	def(&cfg.NumGPUBlocks, blocks)
	def(&cfg.MaxNumSeqs, DefaultMaxNumSeqs)
	def(&cfg.MaxNumBatchedTokens, DefaultMaxNumBatchedTokens)
	def(&cfg.MaxModelLen, DefaultMaxModelLen)
	def(&cfg.VocabSize, DefaultVocabSize)
	if cfg.Timing.StepOverhead == 0 {
		cfg.Timing.StepOverhead = t.StepOverhead
	}
	if cfg.Timing.PrefillTokensPerSec == 0 {
		cfg.Timing.PrefillTokensPerSec = t.PrefillTokensPerSec
	}
	if cfg.Timing.DecodePerSeq == 0 {
		cfg.Timing.DecodePerSeq = t.DecodePerSeq
	}
	if cfg.Timing.CPULoadTokensPerSec == 0 {
		cfg.Timing.CPULoadTokensPerSec = t.CPULoadTokensPerSec
	}
	var errs []error
	pos := func(name string, v int) {
		if v <= 0 {
			errs = append(errs, fmt.Errorf("%s must be positive, got %d", name, v))
		}
	}
	pos("block_size", cfg.BlockSize)
	pos("max_num_seqs", cfg.MaxNumSeqs)
	pos("max_num_batched_tokens", cfg.MaxNumBatchedTokens)
	pos("max_model_len", cfg.MaxModelLen)
	pos("vocab_size", cfg.VocabSize)
	if cfg.NumGPUBlocks < 2 {
		errs = append(errs, fmt.Errorf("num_gpu_blocks must be at least 2 (one is the null block), got %d", cfg.NumGPUBlocks))
	}
	if cfg.NumCPUBlocks < 0 {
		errs = append(errs, fmt.Errorf("num_cpu_blocks must not be negative, got %d", cfg.NumCPUBlocks))
	}
	if cfg.Timing.StepOverhead < 0 || cfg.Timing.DecodePerSeq < 0 ||
		cfg.Timing.PrefillTokensPerSec <= 0 || cfg.Timing.CPULoadTokensPerSec <= 0 {
		errs = append(errs, fmt.Errorf("timing must have non-negative durations and positive rates, got %+v", cfg.Timing))
	}
	// As vLLM refuses to start when one request of max_model_len tokens
	// cannot fit in the KV cache.
	if cfg.BlockSize > 0 && cfg.NumGPUBlocks >= 2 && cfg.MaxModelLen > 0 {
		need := (cfg.MaxModelLen + cfg.BlockSize - 1) / cfg.BlockSize
		if need > cfg.NumGPUBlocks-1 {
			errs = append(errs, fmt.Errorf("max_model_len %d needs %d blocks of %d tokens but only %d GPU blocks are usable",
				cfg.MaxModelLen, need, cfg.BlockSize, cfg.NumGPUBlocks-1))
		}
	}
	return cfg, errors.Join(errs...)
}

// stepDuration applies the timing model.
func (t *Timing) stepDuration(prefillTokens, decodeSeqs, loadTokens int) time.Duration {
	if prefillTokens == 0 && decodeSeqs == 0 && loadTokens == 0 {
		return 0
	}
	d := t.StepOverhead + time.Duration(decodeSeqs)*t.DecodePerSeq
	secs := float64(prefillTokens)/t.PrefillTokensPerSec + float64(loadTokens)/t.CPULoadTokensPerSec
	return d + time.Duration(secs*float64(time.Second))
}
