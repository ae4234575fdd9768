package fleet

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
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
	answered := ep.Await(at(5 * time.Second))
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
