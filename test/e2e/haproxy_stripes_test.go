package e2e

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"kvrouter/internal/bench"
	"kvrouter/internal/bench/report"
	"kvrouter/internal/workload"
)

// TestE2EStripesBehindHAProxy: six engine-sim processes; one kvrouter
// serve process, then two and three behind a real HAProxy (round-robin),
// each count once without stripes and once with static routers /
// router_index (docs/routing.md, "Several router replicas: stripes"),
// replay the same Mooncake slice in the same run (prefix caches reset
// before each), at 120 and at 30 req/s. In a last three-replica striped
// run (30 req/s) one router process is
// killed (SIGKILL) mid-run: the only failed requests are those it had in
// flight (as TestE2EReplicasBehindHAProxy). The hit rates and goodputs are
// logged for docs/results/2026-12-01-measurements.md ("Router replicas, live: stripes"); the
// test requires, at 30 req/s, no failed request elsewhere, and every run's
// hit rate within 0.9 of one router's.
func TestE2EStripesBehindHAProxy(t *testing.T) {
	if os.Getenv("KVROUTER_LIVE_STRIPES") != "1" {
		// A measurement (about a minute of real-time replays whose goodput
		// moves with the machine's load), not run by make test; the
		// failure-free kill is checked there by TestE2EReplicasBehindHAProxy.
		t.Skip("set KVROUTER_LIVE_STRIPES=1 to measure stripes behind HAProxy")
	}
	bin := e2eBuild(t)
	var sims []*e2eSim
	var engines []string
	for range 6 {
		s := startSnapSim(t, bin, 10000, 4096)
		sims = append(sims, s)
		engines = append(engines, s.url)
	}
	config := func(routers, index int) string {
		var y strings.Builder
		y.WriteString("health: {probe_interval: 200ms, scrape_interval: 200ms}\nmodels:\n  - name: m\n    tokenizer: none\n")
		if routers > 1 {
			fmt.Fprintf(&y, "    routing: {routers: %d, router_index: %d}\n", routers, index)
		}
		y.WriteString("    engines:\n")
		for i, s := range sims {
			fmt.Fprintf(&y, "      - {name: e%d, url: %q, events: %q, replay: %q}\n", i, s.url, s.events, s.replay)
		}
		return y.String()
	}
	var plain, two, three []*lbRouterProc
	for range 3 {
		plain = append(plain, startRouterProc(t, bin, config(1, 0)))
	}
	for k := range 2 {
		two = append(two, startRouterProc(t, bin, config(2, k)))
	}
	for k := range 3 {
		three = append(three, startRouterProc(t, bin, config(3, k)))
	}
	fronts := startHAProxy(t, plain[:2], two, plain, three)

	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	slo := report.SLO{TTFT: 2 * time.Second, ITL: 100 * time.Millisecond}
	var w *workload.Workload
	runOne := func(name, url string) *report.Run {
		t.Helper()
		run, err := bench.Run(t.Context(), bench.Config{Name: name, Targets: []string{url}, Policy: bench.PolicyRouter,
			Model: "m", Metrics: engines, Reset: true, Timeout: time.Minute, MaxInFlight: 1024, Seed: 1}, w, nil, log)
		if err != nil {
			t.Fatal(err)
		}
		return run
	}
	// Each arrival rate: the five runs, logged and checked; the last rate's
	// runs continue with the kill.
	var rep *report.Report
	var runs []*report.Run
	for _, rate := range []float64{120, 30} {
		wf := workload.Spec{Kind: "mooncake", Requests: 160, MaxInput: 3000, MaxOutput: 64, Rate: rate, Seed: 1}
		var err error
		if w, err = wf.Build(mooncakeTrace(t)); err != nil {
			t.Fatal(err)
		}
		runs = []*report.Run{
			runOne("1 router", plain[0].url),
			runOne("2 routers, no stripes", fronts[0]),
			runOne("2 routers, stripes", fronts[1]),
			runOne("3 routers, no stripes", fronts[2]),
			runOne("3 routers, stripes", fronts[3]),
		}
		if rate != 30 {
			rep = report.New(fmt.Sprintf("router replicas behind haproxy, stripes: mooncake slice at %v req/s, 6 engines", rate), w.Info(), runs, slo)
			// Loaded (on a shared 2-core machine HAProxy's 200 ms checks
			// time out here, taking a router out while it holds
			// requests): failures are logged, not checked.
			checkStripesReport(t, rep, runs, 0)
		}
	}

	victim := three[2]
	killAt := w.Requests[len(w.Requests)*2/5].At
	inflight := make(chan int, 1)
	go func() {
		time.Sleep(killAt) // at that point of the trace: pacing the kill to the replay
		_ = victim.cmd.Process.Signal(syscall.SIGSTOP)
		n := establishedTo(t, victim.url)
		_ = victim.cmd.Process.Signal(syscall.SIGKILL)
		inflight <- n
	}()
	killed := runOne("3 routers, stripes, one killed", fronts[3])
	lost := <-inflight
	runs = append(runs, killed)

	rep = report.New("router replicas behind haproxy, stripes: mooncake slice at 30 req/s, 6 engines", w.Info(), runs, slo)
	checkStripesReport(t, rep, runs, 5)
	var late []string
	failed := 0
	for _, smp := range killed.Samples {
		if smp.Err == "" {
			continue
		}
		failed++
		if smp.Arrival > killAt+300*time.Millisecond {
			late = append(late, fmt.Sprintf("%s at %v: %s", smp.ID, smp.Arrival, smp.Err))
		}
	}
	t.Logf("killed run: %d failed, %d connections open on the killed router when frozen (killed at %v)", failed, lost, killAt)
	if len(late) > 0 || failed > 8 {
		t.Errorf("%d requests failed in the killed run (%d in flight on it); after the kill's detection window: %v", failed, lost, late)
	}
}

// checkStripesReport logs rep and each run's hit rate and goodput against
// the first run's (one router), with the failed requests' errors, and
// checks that the first clean runs had no failed request and that every
// run kept 0.9 of one router's hit rate.
func checkStripesReport(t *testing.T, rep *report.Report, runs []*report.Run, clean int) {
	t.Helper()
	var md strings.Builder
	if err := rep.Markdown(&md); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s\n%s", rep.Title, md.String())
	one := rep.Policies[0]
	for i, p := range rep.Policies {
		t.Logf("%-32s hit %.3f (%.3f of one router), goodput %.2f req/s (%.3f of one router), TTFT p90 %.1f ms, errors %d",
			p.Name, p.HitRate, p.HitRate/one.HitRate, p.GoodputRPS, p.GoodputRPS/one.GoodputRPS, p.TTFT.P90, p.Errors)
		why := map[string]int{}
		for _, smp := range runs[i].Samples {
			if smp.Err != "" {
				why[smp.Err]++
			}
		}
		if len(why) > 0 {
			t.Logf("%s: failed requests by error: %v", p.Name, why)
		}
		if i < clean && p.Errors != 0 {
			t.Errorf("%s: %d failed requests", p.Name, p.Errors)
		}
		if p.HitRate < 0.9*one.HitRate {
			t.Errorf("%s: hit rate %.3f below 0.9 x one router's %.3f", p.Name, p.HitRate, one.HitRate)
		}
	}
}
