package fleet

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"kvrouter/internal/vllm/enginemetrics"
)

// TestStallRules drives checkStall on a manual clock (StallAfter 1s,
// scraping off so the window is StallAfter): an engine is held out only
// when a request has waited StallAfter and nothing was heard from it for
// the window; chunks of other requests, an answered scrape, or the end of
// the waiting request keep it in; its next sign of life lets it back.
func TestStallRules(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	now := t0
	cfg := Config{Endpoints: twoEndpoints(), ProbeInterval: -1, ScrapeInterval: -1, StallAfter: time.Second,
		Now: func() time.Time { return now }}
	f, _ := newTestFleet(t, cfg)
	ep := f.Endpoint("a:1")
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	check := func(d time.Duration, want bool) {
		t.Helper()
		now = at(d)
		f.checkStall(ep)
		if got := ep.Stalled(); got != want {
			t.Fatalf("at %v: Stalled() = %v, want %v", d, got, want)
		}
	}

	check(5*time.Second, false) // nothing waits: an idle engine is not stalled
	answered := ep.Await(at(5*time.Second), 0)
	check(5900*time.Millisecond, false)   // waited 0.9s
	ep.Heard(at(5500 * time.Millisecond)) // bytes of another request
	check(6200*time.Millisecond, false)   // waited 1.2s but heard 0.7s ago
	check(6600*time.Millisecond, true)    // silent 1.1s, waited 1.6s
	if eps, _, _ := f.Healthy(nil, "m"); len(eps) != 1 || eps[0].Name() != "b:1" {
		t.Fatalf("healthy while a:1 stalled: %d endpoints", len(eps))
	}
	check(8*time.Second, true) // still silent
	ep.Heard(at(8100 * time.Millisecond))
	check(8200*time.Millisecond, false) // answers again
	answered()
	answered()                   // idempotent
	check(20*time.Second, false) // nothing waits any more
	if got := testutil.ToFloat64(f.m.ejections.WithLabelValues("a:1", "stall")); got != 1 {
		t.Fatalf("stall ejections %v, want 1", got)
	}
}

// stallRig drives one endpoint's stall detection on a manual clock.
type stallRig struct {
	t   *testing.T
	f   *Fleet
	ep  *Endpoint
	t0  time.Time
	now *time.Time
}

// newStallRig makes a fleet with StallAfter 1s, probes and scrapes off
// (the test calls their handlers) and the given scrape interval for the
// window (0: scraping off, window = StallAfter).
func newStallRig(t *testing.T, scrape time.Duration) *stallRig {
	t0 := time.Unix(1_800_000_000, 0)
	now := new(time.Time)
	*now = t0
	cfg := Config{Endpoints: twoEndpoints(), ProbeInterval: -1, ScrapeInterval: -1, StallAfter: time.Second,
		Now: func() time.Time { return *now }}
	if scrape > 0 {
		cfg.ScrapeInterval = scrape
	}
	f, _ := newTestFleet(t, cfg)
	return &stallRig{t: t, f: f, ep: f.Endpoint("a:1"), t0: t0, now: now}
}

func (r *stallRig) at(d time.Duration) time.Time { return r.t0.Add(d) }

// check runs the detector at d and wants Stalled() == want.
func (r *stallRig) check(d time.Duration, want bool) {
	r.t.Helper()
	*r.now = r.at(d)
	r.f.checkStall(r.ep)
	if got := r.ep.Stalled(); got != want {
		r.t.Fatalf("at %v: Stalled() = %v, want %v", d, got, want)
	}
}

// vllmMetrics are a vLLM engine's figures: token counters and gauges.
func vllmMetrics(prompt, gen, running, waiting float64) enginemetrics.Metrics {
	return enginemetrics.Metrics{PromptTokens: prompt, GenerationTokens: gen, PrefixCacheQueries: prompt,
		Running: running, Waiting: waiting}
}

// TestStallFrozenCounters: a vLLM engine whose core hangs keeps answering
// /health and /metrics, its counters and gauges frozen. A request waiting
// on it is overdue after StallAfter (1s); with a 1s scrape interval the
// window is 1.5s from the later of the last progress and the request's
// send. Answered probes and frozen scrapes don't keep it in, nor let it
// back while requests wait or while its frozen gauges still show work;
// moving counters, or reporting no work once nothing waits, do.
func TestStallFrozenCounters(t *testing.T) {
	r := newStallRig(t, time.Second)
	ep := r.ep
	ep.scraped(r.at(0), vllmMetrics(100, 50, 1, 0))
	ep.scraped(r.at(time.Second), vllmMetrics(200, 80, 2, 0)) // moving: alive at 1s
	answered := ep.Await(r.at(1200*time.Millisecond), 0)      // the core hangs from here
	ep.probeAnswered(r.at(2 * time.Second))
	ep.scraped(r.at(2*time.Second), vllmMetrics(200, 80, 2, 0)) // frozen
	r.check(2300*time.Millisecond, false)                       // overdue, but silent only 1.1s < 1.5s
	ep.probeAnswered(r.at(2500 * time.Millisecond))
	r.check(2800*time.Millisecond, true) // silent 1.6s since it was sent
	ep.scraped(r.at(3*time.Second), vllmMetrics(200, 80, 2, 0))
	ep.probeAnswered(r.at(3 * time.Second))
	r.check(3100*time.Millisecond, true) // frozen scrape, probe: still out
	answered()                           // the client gave up
	ep.probeAnswered(r.at(4 * time.Second))
	ep.scraped(r.at(4*time.Second), vllmMetrics(200, 80, 2, 0))
	r.check(4100*time.Millisecond, true) // nothing waits, but its frozen gauges show work
	ep.scraped(r.at(5*time.Second), vllmMetrics(200, 80, 0, 0))
	r.check(5100*time.Millisecond, false) // the core is back: it reports no work
	if got := testutil.ToFloat64(r.f.m.ejections.WithLabelValues("a:1", "stall")); got != 1 {
		t.Fatalf("stall ejections %v, want 1", got)
	}
}

// TestStallMovingCounters: a busy engine whose counters move at every
// scrape is not stalled while a request waits for its first byte far
// longer than StallAfter (it queues behind other work); once its counters
// stop moving, it is. Moving counters let a stalled engine back while
// requests still wait.
func TestStallMovingCounters(t *testing.T) {
	r := newStallRig(t, time.Second)
	ep := r.ep
	ep.Await(r.at(500*time.Millisecond), 0)
	for i := range 10 {
		d := time.Duration(i) * time.Second
		ep.scraped(r.at(d), vllmMetrics(1000, float64(100*i), 8, 3))
		r.check(d+900*time.Millisecond, false)
	}
	r.check(11*time.Second, true) // no move since 9s
	ep.scraped(r.at(11500*time.Millisecond), vllmMetrics(1000, 1000, 8, 3))
	r.check(11600*time.Millisecond, false)
}

// TestStallLongPrefill: a request predicted to take 5s to its first token
// (a 100K-token prefill at 20K tokens/s) on an engine that shows nothing
// meanwhile (its counters move only when the prefill ends) is overdue
// after 2 x 5s, not after StallAfter.
func TestStallLongPrefill(t *testing.T) {
	r := newStallRig(t, time.Second)
	ep := r.ep
	ep.scraped(r.at(0), vllmMetrics(0, 0, 0, 0))
	ep.Await(r.at(100*time.Millisecond), 5*time.Second)
	for d := time.Second; d < 10*time.Second; d += time.Second {
		ep.scraped(r.at(d), vllmMetrics(100_000, 0, 1, 0)) // admitted, then frozen figures
		r.check(d+500*time.Millisecond, false)
	}
	r.check(10050*time.Millisecond, false) // 9.95s waited
	r.check(10150*time.Millisecond, true)  // 10.05s: overdue and silent
}

// TestStallNoCounters: an engine whose /metrics lacks vLLM's token
// counters keeps the old rule: every answered scrape is a sign of life.
// Probes count only while nothing waits.
func TestStallNoCounters(t *testing.T) {
	r := newStallRig(t, time.Second)
	ep := r.ep
	other := enginemetrics.Metrics{Missing: []string{"vllm:num_requests_running", "vllm:num_requests_waiting",
		"vllm:prompt_tokens_total", "vllm:generation_tokens_total"}}
	answered := ep.Await(r.at(0), 0)
	for d := time.Second; d <= 5*time.Second; d += time.Second {
		ep.scraped(r.at(d), other)
		r.check(d+500*time.Millisecond, false)
	}
	ep.probeAnswered(r.at(6 * time.Second)) // scrapes stop; a probe while a request waits
	r.check(6600*time.Millisecond, true)    // silent 1.6s since the last scrape
	answered()
	ep.probeAnswered(r.at(7 * time.Second)) // nothing waits: a probe is a sign of life
	r.check(7100*time.Millisecond, false)
}
