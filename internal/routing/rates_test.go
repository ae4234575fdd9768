package routing

import (
	"math"
	"testing"
	"time"
)

func TestLearnRatesModeResolution(t *testing.T) {
	for _, tt := range []struct {
		prefill, decode float64
		mode, want      string
	}{
		{0, 0, "", LearnOn},
		{0, 0, LearnAuto, LearnOn},
		{8000, 0, "", LearnDecode},
		{0, 900, "", LearnPrefill},
		{8000, 900, "", LearnOff},
		{8000, 900, LearnOn, LearnOn},
		{0, 0, LearnOff, LearnOff},
	} {
		cfg := DefaultConfig(Config{PrefillRate: tt.prefill, DecodeRate: tt.decode, LearnRates: RateLearning{Mode: tt.mode}})
		if cfg.LearnRates.Mode != tt.want {
			t.Errorf("prefill_rate %v decode_rate %v mode %q: resolved %q, want %q", tt.prefill, tt.decode, tt.mode, cfg.LearnRates.Mode, tt.want)
		}
		if again := DefaultConfig(cfg); again.LearnRates != cfg.LearnRates {
			t.Errorf("DefaultConfig not idempotent: %+v then %+v", cfg.LearnRates, again.LearnRates)
		}
	}
	if _, err := New(Config{LearnRates: RateLearning{Mode: "sometimes"}}, nil, nil, nil); err == nil {
		t.Error("New accepted learn_rates.mode sometimes")
	}
	if _, err := New(Config{LearnRates: RateLearning{MinFactor: 2, MaxFactor: 1}}, nil, nil, nil); err == nil {
		t.Error("New accepted min_factor > max_factor")
	}
}

// engine is a fake engine's cumulative counters: it prefills at prefill
// tokens/s and decodes at decode tokens/s, running conc requests at once
// in each phase (their per-request phase times overlap).
type engine struct {
	s               RateSample
	prefill, decode float64
}

// run advances the engine by wall seconds, busy for the fraction busy of
// them, with conc requests sharing each busy second.
func (e *engine) run(wall, busy, conc float64) RateSample {
	e.s.At = e.s.At.Add(time.Duration(wall * float64(time.Second)))
	e.s.PrefillTokens += e.prefill * wall * busy
	e.s.PrefillSeconds += wall * busy * conc
	e.s.DecodeTokens += e.decode * wall * busy
	e.s.DecodeSeconds += wall * busy * conc
	return e.s
}

func rates(t *testing.T, r *Router, name string) (float64, float64) {
	t.Helper()
	l, ok := r.Load(name)
	if !ok {
		t.Fatalf("no replica %s", name)
	}
	return l.PrefillRate, l.DecodeRate
}

func near(got, want, tol float64) bool { return math.Abs(got-want) <= tol*want }

func TestObserveRatesConverges(t *testing.T) {
	for _, tt := range []struct {
		name       string
		busy, conc float64
	}{
		{"one request at a time", 0.6, 1},
		{"busy throughout, 8 overlapping", 1, 8},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r, err := New(Config{}, nil, nil, nil) // defaults 10,000 and 2,000, both learned
			if err != nil {
				t.Fatal(err)
			}
			r.AddReplica("a")
			e := &engine{s: RateSample{At: time.Unix(1000, 0)}, prefill: 4000, decode: 3000}
			r.ObserveRates("a", e.s)
			if p, d := rates(t, r, "a"); p != 10000 || d != 2000 {
				t.Fatalf("after the baseline: %v %v, want the configured 10000 2000", p, d)
			}
			// 5 s scrapes for 10 minutes.
			var after60 float64
			for i := 1; i <= 120; i++ {
				r.ObserveRates("a", e.run(5, tt.busy, tt.conc))
				if i == 12 {
					after60, _ = rates(t, r, "a")
				}
			}
			p, d := rates(t, r, "a")
			if !near(p, 4000, 0.01) || !near(d, 3000, 0.01) {
				t.Errorf("learned %v %v, want 4000 3000 within 1%%", p, d)
			}
			// Past half-way within 60 s of scrapes at >= 60% busy (36 s of busy
			// time, half-life 20 s).
			if !(after60 < 7000) {
				t.Errorf("prefill rate after 60 s %v, want below 7000 (halfway from 10000 to 4000)", after60)
			}
		})
	}
}

func TestObserveRatesPartialOverlapIsConservative(t *testing.T) {
	// Half busy with 2 requests overlapping: summed phase time equals the
	// wall interval while true busy time is half of it, so the estimate is
	// half the true rate (documented low bias), never above it.
	r, _ := New(Config{}, nil, nil, nil)
	r.AddReplica("a")
	e := &engine{s: RateSample{At: time.Unix(1000, 0)}, prefill: 4000, decode: 3000}
	r.ObserveRates("a", e.s)
	for range 200 {
		r.ObserveRates("a", e.run(5, 0.5, 2))
	}
	if p, _ := rates(t, r, "a"); !near(p, 2000, 0.01) {
		t.Errorf("prefill rate %v, want 2000 (tokens over min(summed, wall) seconds)", p)
	}
}

func TestObserveRatesExplicitRateStays(t *testing.T) {
	r, _ := New(Config{PrefillRate: 8000}, nil, nil, nil)
	r.AddReplica("a")
	e := &engine{s: RateSample{At: time.Unix(1000, 0)}, prefill: 4000, decode: 3000}
	r.ObserveRates("a", e.s)
	for range 100 {
		r.ObserveRates("a", e.run(5, 1, 1))
	}
	p, d := rates(t, r, "a")
	if p != 8000 {
		t.Errorf("explicit prefill_rate 8000 became %v", p)
	}
	if !near(d, 3000, 0.01) {
		t.Errorf("decode rate (not set, learned) %v, want 3000", d)
	}
	off, _ := New(Config{LearnRates: RateLearning{Mode: LearnOff}}, nil, nil, nil)
	off.AddReplica("a")
	off.ObserveRates("a", e.s)
	off.ObserveRates("a", e.run(5, 1, 1))
	if p, d := rates(t, off, "a"); p != 10000 || d != 2000 {
		t.Errorf("mode off changed rates to %v %v", p, d)
	}
}

func TestObserveRatesRestartShortAndBounds(t *testing.T) {
	r, _ := New(Config{LearnRates: RateLearning{MaxFactor: 3}}, nil, nil, nil)
	r.AddReplica("a")
	r.ObserveRates("unknown", RateSample{}) // ignored
	e := &engine{s: RateSample{At: time.Unix(1000, 0)}, prefill: 4000, decode: 3000}
	r.ObserveRates("a", e.s)
	// Intervals of 50 ms busy each are carried until 250 ms accumulate.
	for range 4 {
		r.ObserveRates("a", e.run(1, 0.05, 1))
	}
	if p, _ := rates(t, r, "a"); p != 10000 {
		t.Errorf("learned from %v s of busy time: %v", 0.2, p)
	}
	r.ObserveRates("a", e.run(1, 0.05, 1))
	if p, _ := rates(t, r, "a"); p == 10000 || p < 4000 {
		t.Errorf("after 250 ms busy: %v, want moved from 10000 toward 4000", p)
	}
	// A restart: counters start again from 0; that interval is skipped.
	before, _ := rates(t, r, "a")
	restarted := RateSample{At: e.s.At.Add(5 * time.Second)}
	r.ObserveRates("a", restarted)
	if p, _ := rates(t, r, "a"); p != before {
		t.Errorf("restart interval changed the rate %v -> %v", before, p)
	}
	// An absurd engine (100x the configured rate) is held at max_factor.
	fast := &engine{s: restarted, prefill: 1e6, decode: 2e5}
	for range 200 {
		r.ObserveRates("a", fast.run(5, 1, 1))
	}
	if p, d := rates(t, r, "a"); p != 30000 || d != 6000 {
		t.Errorf("bounded rates %v %v, want 3x the configured: 30000 6000", p, d)
	}
}
