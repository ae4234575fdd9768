package report

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"kvrouter/internal/workload"
)

// Report compares policies on one workload.
type Report struct {
	// Title heads the HTML page, e.g. "kvrouter sim: mooncake, 8 replicas".
	Title string `json:"title"`
	// Policies holds one row per run, in the order given to New.
	Policies []PolicyResult `json:"policies"`
	// Workload describes the requests every policy received.
	Workload workload.Info `json:"workload"`
	// SLO is the goodput threshold, in milliseconds.
	SLO struct {
		TTFTMs float64 `json:"ttft_ms"`
		ITLMs  float64 `json:"itl_ms"`
	} `json:"slo"`
	// HitRateBound, when positive, is the hit rate no policy can exceed on
	// this workload (every earlier block cached everywhere, forever).
	HitRateBound float64 `json:"hit_rate_bound,omitempty"`
	// PooledBound, when set, is the hit rate of the fleet's cache pooled
	// into one LRU (see SetPooledBound).
	PooledBound *PooledBound `json:"pooled_bound,omitempty"`
	// Setup records the run's settings (replicas, engine profile, ...).
	Setup map[string]string `json:"setup,omitempty"`
	// Sweep holds goodput per policy at each offered load of a --load
	// sweep, by load (AddSweep); empty for a single run.
	Sweep []SweepPoint `json:"sweep,omitempty"`

	runs []*Run
}

// New summarises runs (kept for the HTML plots) under slo.
func New(title string, w workload.Info, runs []*Run, slo SLO) *Report {
	r := &Report{Title: title, Workload: w, runs: runs}
	r.SLO.TTFTMs, r.SLO.ITLMs = ms(slo.TTFT), ms(slo.ITL)
	for _, run := range runs {
		r.Policies = append(r.Policies, Summarize(run, slo))
	}
	return r
}

// JSON writes the report as indented JSON.
func (r *Report) JSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("write json report: %w", err)
	}
	return nil
}

// Markdown writes the comparison as a GitHub markdown table, one row per
// policy, followed by the SLO and workload in one line each.
func (r *Report) Markdown(w io.Writer) error {
	var b strings.Builder
	b.WriteString("| policy | requests | errors | hit rate | TTFT p50 / p90 / p99 (ms) | ITL p50 / p99 (ms) | e2e p50 / p99 (ms) | throughput (tok/s) | goodput (req/s) | max/mean load | preemptions |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, p := range r.Policies {
		hit := pct(p.HitRate)
		if p.EngineHitRate != nil {
			hit += fmt.Sprintf(" (engine %s)", pct(*p.EngineHitRate))
		}
		pre := fmt.Sprint(p.Preemptions)
		if p.Preemptions < 0 {
			pre = "n/a"
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %s | %s / %s / %s | %s / %s | %s / %s | %.0f | %.2f | %.2f | %s |\n",
			p.Name, p.Requests, p.Errors, hit,
			num(p.TTFT.P50), num(p.TTFT.P90), num(p.TTFT.P99),
			num(p.ITL.P50), num(p.ITL.P99), num(p.E2E.P50), num(p.E2E.P99),
			p.ThroughputTokS, p.GoodputRPS, p.MaxMeanLoad, pre)
	}
	fmt.Fprintf(&b, "\nGoodput SLO: TTFT <= %s ms, TPOT <= %s ms.", num(r.SLO.TTFTMs), num(r.SLO.ITLMs))
	if r.HitRateBound > 0 {
		fmt.Fprintf(&b, " Hit-rate bound (every earlier block cached everywhere): %s.", pct(r.HitRateBound))
	}
	r.pooledMarkdown(&b)
	for _, p := range r.Policies {
		if p.EngineHitRate != nil {
			b.WriteString(" Engine hit rates (in parentheses) are the engines' own prefix-cache counters, which count every prefill, a preempted request's again.")
			break
		}
	}
	fmt.Fprintf(&b, "\nWorkload: %s, %d requests, %d input / %d output tokens over %.1f s.\n",
		r.Workload.Name, r.Workload.Requests, r.Workload.InputTokens, r.Workload.OutputTokens, r.Workload.DurationS)
	r.sweepMarkdown(&b)
	_, err := io.WriteString(w, b.String())
	if err != nil {
		return fmt.Errorf("write markdown report: %w", err)
	}
	return nil
}

func pct(v float64) string { return fmt.Sprintf("%.1f%%", 100*v) }

// num prints milliseconds with 3 significant digits below 100 and as
// integers above.
func num(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}
