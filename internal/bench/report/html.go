package report

import (
	"encoding/json"
	"fmt"
	"html"
	"io"
	"strings"
)

// plotBins is the number of time bins of the over-time plots.
const plotBins = 120

// HTML writes one self-contained page: the comparison table, TTFT, ITL and
// end-to-end latency CDFs per policy, hit rate over time per policy (with
// the hit-rate bound as a dashed line when known), in-flight requests per
// replica over time for each policy (one colour per replica on every plot),
// and the report's JSON in a
// <script type="application/json" id="report-data"> element. The page loads
// nothing from the network and runs no scripts.
func (r *Report) HTML(w io.Writer) error {
	var b strings.Builder
	title := html.EscapeString(r.Title)
	fmt.Fprintf(&b, "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\"/>\n<title>%s</title>\n", title)
	b.WriteString(`<style>
body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1100px}
table{border-collapse:collapse;font-size:13px}th,td{border:1px solid #ccc;padding:4px 8px;text-align:right}
th:first-child,td:first-child{text-align:left}
svg{display:block;margin:12px 0;background:#fff}
.title{font-size:14px;font-weight:600}.axis{font-size:11px;fill:#444}.legend{font-size:12px}
.frame{fill:none;stroke:#999}.grid{stroke:#e4e4e4}
</style>
</head>
<body>
`)
	fmt.Fprintf(&b, "<h1>%s</h1>\n", title)
	fmt.Fprintf(&b, "<p>Workload <b>%s</b>: %d requests, %d input and %d output tokens, arrivals over %.1f s. Goodput SLO: TTFT ≤ %s ms and TPOT ≤ %s ms.</p>\n",
		html.EscapeString(r.Workload.Name), r.Workload.Requests, r.Workload.InputTokens, r.Workload.OutputTokens,
		r.Workload.DurationS, num(r.SLO.TTFTMs), num(r.SLO.ITLMs))
	r.htmlTable(&b)

	lo, hi := span(r.runs)
	cdf := func(title, x string) chart {
		return chart{title: title + ", cumulative distribution", xlabel: x + " (ms, log scale)", ylabel: "share",
			xlog: true, yFixed: true, ymin: 0, ymax: 1, legend: true}
	}
	ttft, itl, e2e := cdf("TTFT", "TTFT"), cdf("Inter-token latency", "gap between tokens"), cdf("End-to-end latency", "e2e")
	hit := chart{title: "Prefix-cache hit rate over time", xlabel: "time (s)", ylabel: "hit rate",
		yFixed: true, ymin: 0, ymax: 1, legend: true}
	for i, run := range r.runs {
		ttft.series = append(ttft.series, series{name: run.Policy, color: color(i), pts: ttftCDF(run, 200)})
		itl.series = append(itl.series, series{name: run.Policy, color: color(i), pts: itlCDF(run, 200)})
		e2e.series = append(e2e.series, series{name: run.Policy, color: color(i), pts: e2eCDF(run, 200)})
		hit.series = append(hit.series, series{name: run.Policy, color: color(i), pts: hitRateOverTime(run, lo, hi, plotBins/2)})
	}
	if r.HitRateBound > 0 { // the bound no policy can exceed (Report.HitRateBound)
		hit.series = append(hit.series, series{name: "bound", color: "#777777", dash: true, width: 1.2,
			pts: []point{{lo.Seconds(), r.HitRateBound}, {hi.Seconds(), r.HitRateBound}}})
	}
	r.sweepSVG(&b, func(policy string) string {
		for i, run := range r.runs {
			if run.Policy == policy {
				return color(i)
			}
		}
		return color(len(r.runs))
	})
	ttft.svg(&b)
	itl.svg(&b)
	e2e.svg(&b)
	hit.svg(&b)
	colors := replicaColors(r.runs)
	for _, run := range r.runs {
		names, load := loadOverTime(run, lo, hi, plotBins)
		c := chart{title: "In-flight requests per replica: " + run.Policy, xlabel: "time (s)", ylabel: "requests (time-averaged)",
			legend: len(names) <= 8}
		for j, n := range names {
			if j < len(load) {
				c.series = append(c.series, series{name: n, color: colors[n], width: 1.2, pts: load[j]})
			}
		}
		c.svg(&b)
	}
	data, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("write html report: %w", err)
	}
	// JSON inside <script>: escape "<" so no "</script>" can end it early.
	fmt.Fprintf(&b, "<script type=\"application/json\" id=\"report-data\">%s</script>\n</body>\n</html>\n",
		strings.ReplaceAll(string(data), "<", `\u003c`))
	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("write html report: %w", err)
	}
	return nil
}

func (r *Report) htmlTable(b *strings.Builder) {
	b.WriteString("<table>\n<thead><tr><th>policy</th><th>requests</th><th>errors</th><th>hit rate</th><th>TTFT p50</th><th>TTFT p90</th><th>TTFT p99</th><th>ITL p50</th><th>ITL p99</th><th>e2e p50</th><th>e2e p99</th><th>throughput (tok/s)</th><th>goodput (req/s)</th><th>max/mean load</th><th>preemptions</th></tr></thead>\n<tbody>\n")
	for _, p := range r.Policies {
		hit := pct(p.HitRate)
		if p.EngineHitRate != nil {
			hit += " (engine " + pct(*p.EngineHitRate) + ")"
		}
		fmt.Fprintf(b, "<tr><td>%s</td><td>%d</td><td>%d</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%.0f</td><td>%.2f</td><td>%.2f</td><td>%d</td></tr>\n",
			html.EscapeString(p.Name), p.Requests, p.Errors, hit, num(p.TTFT.P50), num(p.TTFT.P90), num(p.TTFT.P99),
			num(p.ITL.P50), num(p.ITL.P99), num(p.E2E.P50), num(p.E2E.P99), p.ThroughputTokS, p.GoodputRPS, p.MaxMeanLoad, p.Preemptions)
	}
	b.WriteString("</tbody>\n</table>\n<p>Times in milliseconds.</p>\n")
}
