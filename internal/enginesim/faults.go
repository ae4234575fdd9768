package enginesim

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"
)

// Faults are the injected failures. Rates are probabilities per request in
// [0, 1]; zero fields disable their fault.
type Faults struct {
	// ErrorRate answers that fraction of generation requests with
	// ErrorStatus (default 500) and an OpenAI error body, before any work.
	ErrorRate   float64 `yaml:"error_rate"`
	ErrorStatus int     `yaml:"error_status"`
	// SpikeRate delays that fraction of requests by SpikeDelay before they
	// reach the engine (a latency spike: GC pause, slow tokenizer, ...).
	SpikeRate  float64       `yaml:"spike_rate"`
	SpikeDelay time.Duration `yaml:"spike_delay"`
	// DieRate makes that fraction of streaming responses break the
	// connection after DieAfterTokens tokens (default 1), without [DONE].
	DieRate        float64 `yaml:"die_rate"`
	DieAfterTokens int     `yaml:"die_after_tokens"`
	// HangRate makes that fraction of requests hang before the first byte
	// until the client gives up.
	HangRate float64 `yaml:"hang_rate"`
	// SlowStart is the cold-replica period after start and after every
	// restart: step times are multiplied by SlowStartFactor (default 4),
	// falling linearly to 1 at the end of the period.
	SlowStart       time.Duration `yaml:"slow_start"`
	SlowStartFactor float64       `yaml:"slow_start_factor"`
	// DropEveryKBatches drops every k-th KV event batch on the PUB socket
	// (still in the replay buffer, as a high-water-mark drop).
	DropEveryKBatches int `yaml:"drop_every_k_batches"`
	// Seed seeds the fault dice (0 is a valid seed).
	Seed uint64 `yaml:"seed"`
}

func (f Faults) withDefaults() (Faults, error) {
	if f.ErrorStatus == 0 {
		f.ErrorStatus = 500
	}
	if f.DieAfterTokens == 0 {
		f.DieAfterTokens = 1
	}
	if f.SlowStartFactor == 0 {
		f.SlowStartFactor = 4
	}
	var errs []error
	for name, r := range map[string]float64{"error_rate": f.ErrorRate, "spike_rate": f.SpikeRate, "die_rate": f.DieRate, "hang_rate": f.HangRate} {
		if r < 0 || r > 1 {
			errs = append(errs, fmt.Errorf("faults: %s must be in [0, 1], got %v", name, r))
		}
	}
	if f.ErrorStatus < 400 || f.ErrorStatus > 599 {
		errs = append(errs, fmt.Errorf("faults: error_status must be 4xx or 5xx, got %d", f.ErrorStatus))
	}
	if f.SpikeDelay < 0 || f.SlowStart < 0 || f.SlowStartFactor < 1 || f.DieAfterTokens < 0 || f.DropEveryKBatches < 0 {
		errs = append(errs, errors.New("faults: durations, counts must be non-negative and slow_start_factor >= 1"))
	}
	return f, errors.Join(errs...)
}

// dice rolls the fault decisions; safe for concurrent use.
type dice struct {
	mu sync.Mutex
	r  *rand.Rand
}

func newDice(seed uint64) *dice { return &dice{r: rand.New(rand.NewPCG(seed, 0x6b7672))} }

// roll reports true with probability p.
func (d *dice) roll(p float64) bool {
	if p <= 0 {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.r.Float64() < p
}

// slowFactor is the step-time multiplier at elapsed time since (re)start.
func (f *Faults) slowFactor(elapsed time.Duration) float64 {
	if f.SlowStart <= 0 || elapsed >= f.SlowStart {
		return 1
	}
	left := 1 - float64(elapsed)/float64(f.SlowStart)
	return 1 + (f.SlowStartFactor-1)*left
}
