package report

import (
	"fmt"
	"html"
	"sort"
	"strings"
)

// SweepPoint is one policy at one offered load of a --load sweep.
type SweepPoint struct {
	// Load is the offered load: prompt tokens per second over the fleet's
	// prefill capacity, as if nothing were cached.
	Load       float64 `json:"load"`
	Policy     string  `json:"policy"`
	GoodputRPS float64 `json:"goodput_rps"`
	// OfferedRPS is the requests per second offered (requests / duration).
	OfferedRPS float64 `json:"offered_rps"`
	HitRate    float64 `json:"hit_rate"`
	TTFTP99Ms  float64 `json:"ttft_p99_ms"`
}

// AddSweep records the policies of a report run at load as sweep points
// (r keeps its own rows and plots).
func (r *Report) AddSweep(load float64, at *Report) {
	for _, p := range at.Policies {
		pt := SweepPoint{Load: load, Policy: p.Name, GoodputRPS: p.GoodputRPS, HitRate: p.HitRate, TTFTP99Ms: p.TTFT.P99}
		if p.DurationS > 0 {
			pt.OfferedRPS = float64(p.Requests) / p.DurationS
		}
		r.Sweep = append(r.Sweep, pt)
	}
	sort.SliceStable(r.Sweep, func(i, j int) bool { return r.Sweep[i].Load < r.Sweep[j].Load })
}

// sweepPolicies returns the sweep's policies in first-seen order.
func (r *Report) sweepPolicies() []string {
	var out []string
	seen := map[string]bool{}
	for _, p := range r.Sweep {
		if !seen[p.Policy] {
			seen[p.Policy] = true
			out = append(out, p.Policy)
		}
	}
	return out
}

// sweepMarkdown appends the sweep as a table: one row per load, goodput
// per policy.
func (r *Report) sweepMarkdown(b *strings.Builder) {
	if len(r.Sweep) == 0 {
		return
	}
	pols := r.sweepPolicies()
	b.WriteString("\nGoodput (req/s) against offered load:\n\n| load |")
	for _, p := range pols {
		fmt.Fprintf(b, " %s |", p)
	}
	b.WriteString("\n|---:|" + strings.Repeat("---:|", len(pols)) + "\n")
	for i := 0; i < len(r.Sweep); {
		load := r.Sweep[i].Load
		by := map[string]float64{}
		for ; i < len(r.Sweep) && r.Sweep[i].Load == load; i++ {
			by[r.Sweep[i].Policy] = r.Sweep[i].GoodputRPS
		}
		fmt.Fprintf(b, "| %.2g |", load)
		for _, p := range pols {
			fmt.Fprintf(b, " %.2f |", by[p])
		}
		b.WriteString("\n")
	}
}

// sweepSVG appends the goodput-against-load plot, one line per policy in
// the colours of the other plots.
func (r *Report) sweepSVG(b *strings.Builder, colorOf func(policy string) string) {
	if len(r.Sweep) == 0 {
		return
	}
	c := chart{title: "Goodput against offered load", xlabel: "offered load (prompt tokens/s over prefill capacity)",
		ylabel: "goodput (req/s)", legend: true}
	for _, p := range r.sweepPolicies() {
		s := series{name: p, color: colorOf(p)}
		for _, pt := range r.Sweep {
			if pt.Policy == p {
				s.pts = append(s.pts, point{pt.Load, pt.GoodputRPS})
			}
		}
		c.series = append(c.series, s)
	}
	c.svg(b)
	fmt.Fprintf(b, "<p>%s</p>\n", html.EscapeString(fmt.Sprintf("%d loads; the other plots show the run at load %.2g.", len(r.Sweep)/max(1, len(r.sweepPolicies())), r.Sweep[len(r.Sweep)-1].Load)))
}
