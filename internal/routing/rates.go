package routing

import (
	"fmt"
	"math"
	"sync"
	"time"
)

// Rate learning modes (RateLearning.Mode). DefaultConfig resolves
// LearnAuto into one of the others, so a resolved Config says exactly what
// is learned.
const (
	// LearnAuto learns each of prefill_rate and decode_rate that the
	// configuration leaves unset; an explicitly set rate stays
	// authoritative. The default.
	LearnAuto = "auto"
	// LearnOn learns both rates, starting from the configured ones.
	LearnOn = "on"
	// LearnOff never learns: the configured rates (or SetRates) hold.
	LearnOff = "off"
	// LearnPrefill and LearnDecode learn only that rate.
	LearnPrefill = "prefill"
	LearnDecode  = "decode"
)

// RateLearning configures how a Router learns each replica's prefill and
// decode throughput from what its engine reports (Router.ObserveRates).
// Zero fields take the defaults in their comments.
type RateLearning struct {
	// Mode is one of auto (default), on, off, prefill, decode (see the
	// Learn* constants).
	Mode string `yaml:"mode"`
	// HalfLife is how much engine busy time (seconds spent in prefill, or
	// in decode) it takes for an old estimate to weigh half against new
	// observations. Default 20s: a replica busy half the time adapts to a
	// changed rate within about a minute.
	HalfLife time.Duration `yaml:"half_life"`
	// MinBusy is the least busy time an interval must hold to be learned
	// from; shorter intervals are carried over into the next one. Default
	// 250ms.
	MinBusy time.Duration `yaml:"min_busy"`
	// MinFactor and MaxFactor bound an estimate to [MinFactor, MaxFactor]
	// times the starting (configured) rate. Defaults 0.05 and 20.
	MinFactor float64 `yaml:"min_factor"`
	MaxFactor float64 `yaml:"max_factor"`
}

// learns reports whether the resolved mode learns the prefill and the
// decode rate.
func (c RateLearning) learns() (prefill, decode bool) {
	switch c.Mode {
	case LearnOn:
		return true, true
	case LearnPrefill:
		return true, false
	case LearnDecode:
		return false, true
	}
	return false, false
}

// resolve fills defaults; explicitPrefill and explicitDecode say whether
// the configuration set those rates (auto then leaves them alone).
func (c RateLearning) resolve(explicitPrefill, explicitDecode bool) RateLearning {
	if c.Mode == "" || c.Mode == LearnAuto {
		switch {
		case !explicitPrefill && !explicitDecode:
			c.Mode = LearnOn
		case !explicitPrefill:
			c.Mode = LearnPrefill
		case !explicitDecode:
			c.Mode = LearnDecode
		default:
			c.Mode = LearnOff
		}
	}
	if c.HalfLife == 0 {
		c.HalfLife = 20 * time.Second
	}
	if c.MinBusy == 0 {
		c.MinBusy = 250 * time.Millisecond
	}
	if c.MinFactor == 0 {
		c.MinFactor = 0.05
	}
	if c.MaxFactor == 0 {
		c.MaxFactor = 20
	}
	return c
}

func (c RateLearning) validate() error {
	switch c.Mode {
	case LearnOn, LearnOff, LearnPrefill, LearnDecode:
	default:
		return fmt.Errorf("learn_rates.mode %q: want auto, on, off, prefill or decode", c.Mode)
	}
	if c.HalfLife < 0 || c.MinBusy < 0 {
		return fmt.Errorf("learn_rates: half_life %v and min_busy %v must not be negative", c.HalfLife, c.MinBusy)
	}
	if !(c.MinFactor > 0) || !(c.MaxFactor >= c.MinFactor) || math.IsInf(c.MaxFactor, 0) {
		return fmt.Errorf("learn_rates: need 0 < min_factor <= max_factor < inf, got %v and %v", c.MinFactor, c.MaxFactor)
	}
	return nil
}

// RateSample is one reading of an engine's cumulative counters, as vLLM
// exposes them on /metrics (vllm/v1/metrics/loggers.py): prefill and decode
// time are sums over finished requests of vllm:request_prefill_time_seconds
// (first scheduled to first token) and vllm:request_decode_time_seconds
// (first token to finish). Counters only grow while the engine process
// lives; a lower value than at the previous reading means a restart, and
// that interval is skipped.
type RateSample struct {
	// At is when the counters were read (the Router's clock).
	At time.Time
	// PrefillTokens are prompt tokens computed (not found in the prefix
	// cache): vllm:request_prefill_kv_computed_tokens_sum where the
	// engine has it, else vllm:prompt_tokens_total minus
	// vllm:prefix_cache_hits_total.
	PrefillTokens float64
	// PrefillSeconds is the _sum of vllm:request_prefill_time_seconds.
	PrefillSeconds float64
	// DecodeTokens are generated tokens, vllm:generation_tokens_total.
	DecodeTokens float64
	// DecodeSeconds is the _sum of vllm:request_decode_time_seconds.
	DecodeSeconds float64
}

// rateLearner is one replica's estimator. Per interval between two
// samples the throughput is tokens / busy, where busy = min(summed
// per-request seconds, wall seconds): per-request phase times overlap when
// requests share engine steps (a batch of 32 decoding sequences sums 32 s
// of decode time per wall second), so their sum overstates the engine's
// busy time, and the wall interval bounds it. The result is exact for an
// engine that runs one request at a time or is busy throughout, and low
// (conservative) in between. Estimates are an exponentially weighted
// average by busy time (RateLearning.HalfLife), bounded around the start.
type rateLearner struct {
	mu   sync.Mutex
	last RateSample
	seen bool
	// carried tokens and seconds of intervals too short to learn from.
	pTok, pSec, pWall, dTok, dSec, dWall float64
}

// observe folds s in and returns the new prefill and decode estimates from
// the current ones (0 when that rate did not change).
func (l *rateLearner) observe(c RateLearning, s RateSample, prefill, decode, startPrefill, startDecode float64) (newPrefill, newDecode float64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	prev := l.last
	l.last = s
	if !l.seen {
		l.seen = true
		return 0, 0
	}
	if s.PrefillTokens < prev.PrefillTokens || s.PrefillSeconds < prev.PrefillSeconds ||
		s.DecodeTokens < prev.DecodeTokens || s.DecodeSeconds < prev.DecodeSeconds {
		l.pTok, l.pSec, l.pWall, l.dTok, l.dSec, l.dWall = 0, 0, 0, 0, 0, 0
		return 0, 0
	}
	wall := s.At.Sub(prev.At).Seconds()
	if !(wall > 0) {
		return 0, 0
	}
	learnP, learnD := c.learns()
	if learnP {
		l.pTok += s.PrefillTokens - prev.PrefillTokens
		l.pSec += s.PrefillSeconds - prev.PrefillSeconds
		l.pWall += wall
		newPrefill = l.fold(c, &l.pTok, &l.pSec, &l.pWall, prefill, startPrefill)
	}
	if learnD {
		l.dTok += s.DecodeTokens - prev.DecodeTokens
		l.dSec += s.DecodeSeconds - prev.DecodeSeconds
		l.dWall += wall
		newDecode = l.fold(c, &l.dTok, &l.dSec, &l.dWall, decode, startDecode)
	}
	return newPrefill, newDecode
}

// fold turns carried tokens and seconds into an updated estimate once they
// hold MinBusy of busy time, and resets them; otherwise it returns 0 and
// keeps carrying.
func (l *rateLearner) fold(c RateLearning, tok, sec, wall *float64, cur, start float64) float64 {
	busy := math.Min(*sec, *wall)
	if busy < c.MinBusy.Seconds() || !(*tok > 0) {
		if *wall > 10*c.HalfLife.Seconds() {
			// Idle for long: what was carried says nothing any more.
			*tok, *sec, *wall = 0, 0, 0
		}
		return 0
	}
	obs := *tok / busy
	*tok, *sec, *wall = 0, 0, 0
	w := 1 - math.Exp2(-busy/c.HalfLife.Seconds())
	est := cur + w*(obs-cur)
	lo, hi := start*c.MinFactor, start*c.MaxFactor
	return math.Min(hi, math.Max(lo, est))
}

// ObserveRates feeds name's engine counters to its rate learner and, when
// an estimate moved, sets the replica's rates (as SetRates). It does
// nothing for unknown names or when Config.LearnRates learns neither rate.
// Call it at every scrape; the first call only records the baseline.
func (r *Router) ObserveRates(name string, s RateSample) {
	if p, d := r.cfg.LearnRates.learns(); !p && !d {
		return
	}
	rep := r.get(name)
	if rep == nil {
		return
	}
	p, d := rep.learn.observe(r.cfg.LearnRates, s,
		math.Float64frombits(rep.prefillRate.Load()), math.Float64frombits(rep.decodeRate.Load()),
		r.cfg.PrefillRate, r.cfg.DecodeRate)
	if p > 0 {
		rep.prefillRate.Store(math.Float64bits(p))
	}
	if d > 0 {
		rep.decodeRate.Store(math.Float64bits(d))
	}
}
