package report

import (
	"slices"
	"time"
)

// point is one (x, y) of a plotted series.
type point struct{ X, Y float64 }

// ttftCDF returns the TTFT distribution of successful requests as at most
// n+1 points (ms, cumulative share).
func ttftCDF(r *Run, n int) []point {
	var v []float64
	for i := range r.Samples {
		if s := &r.Samples[i]; s.ok() {
			v = append(v, ms(s.TTFT()))
		}
	}
	if len(v) == 0 {
		return nil
	}
	slices.Sort(v)
	pts := make([]point, 0, n+1)
	for i := 0; i <= n; i++ {
		q := float64(i) / float64(n)
		pts = append(pts, point{Percentile(v, q), q})
	}
	return pts
}

// e2eCDF returns the end-to-end latency distribution of successful
// requests as at most n+1 points (ms, cumulative share).
func e2eCDF(r *Run, n int) []point {
	var v []float64
	for i := range r.Samples {
		if s := &r.Samples[i]; s.ok() {
			v = append(v, ms(s.End-s.Arrival))
		}
	}
	if len(v) == 0 {
		return nil
	}
	slices.Sort(v)
	pts := make([]point, 0, n+1)
	for i := 0; i <= n; i++ {
		q := float64(i) / float64(n)
		pts = append(pts, point{Percentile(v, q), q})
	}
	return pts
}

// itlCDF returns the pooled inter-token gap distribution (Run.ITL) as at
// most n+1 points (ms, cumulative share), read back from the histogram.
func itlCDF(r *Run, n int) []point {
	if r.ITL.Count() == 0 {
		return nil
	}
	pts := make([]point, 0, n+1)
	for i := 0; i <= n; i++ {
		q := float64(i) / float64(n)
		pts = append(pts, point{ms(r.ITL.Quantile(q)), q})
	}
	return pts
}

// replicaColors gives every replica of every run one colour, by its place
// in the sorted union of their names, so a replica looks the same on every
// plot.
func replicaColors(runs []*Run) map[string]string {
	seen := map[string]bool{}
	var names []string
	for _, r := range runs {
		all, _ := busy(r)
		for _, n := range all {
			if !seen[n] {
				seen[n] = true
				names = append(names, n)
			}
		}
	}
	slices.Sort(names)
	out := make(map[string]string, len(names))
	for i, n := range names {
		out[n] = color(i)
	}
	return out
}

// span returns the earliest arrival and the latest end over all runs.
func span(runs []*Run) (lo, hi time.Duration) {
	first := true
	for _, r := range runs {
		for i := range r.Samples {
			s := &r.Samples[i]
			if first {
				lo, hi, first = s.Arrival, s.End, false
			}
			lo, hi = min(lo, s.Arrival), max(hi, s.End)
		}
	}
	return lo, hi
}

// loadOverTime returns, per replica (ordered like busy's names), the
// time-averaged number of in-flight requests in each of bins equal bins of
// [lo, hi), as points (seconds at the bin's centre, requests).
func loadOverTime(r *Run, lo, hi time.Duration, bins int) (names []string, series [][]point) {
	names, _ = busy(r)
	idx := make(map[string]int, len(names))
	for i, n := range names {
		idx[n] = i
	}
	width := float64(hi-lo) / float64(bins)
	if width <= 0 {
		return names, nil
	}
	acc := make([][]float64, len(names))
	for i := range acc {
		acc[i] = make([]float64, bins)
	}
	for i := range r.Samples {
		s := &r.Samples[i]
		j, ok := idx[s.Replica]
		if !ok || s.End <= s.Arrival {
			continue
		}
		a, e := float64(s.Arrival-lo), float64(s.End-lo)
		for b := max(0, int(a/width)); b < bins && float64(b)*width < e; b++ {
			bl, bh := float64(b)*width, float64(b+1)*width
			acc[j][b] += (min(e, bh) - max(a, bl)) / width
		}
	}
	series = make([][]point, len(names))
	for j := range acc {
		series[j] = make([]point, bins)
		for b, v := range acc[j] {
			series[j][b] = point{(time.Duration(lo) + time.Duration((float64(b)+0.5)*width)).Seconds(), v}
		}
	}
	return names, series
}

// hitRateOverTime returns the hit rate (cached / prompt tokens) of the
// successful requests arriving in each of bins equal bins of [lo, hi);
// empty bins are left out.
func hitRateOverTime(r *Run, lo, hi time.Duration, bins int) []point {
	width := float64(hi-lo) / float64(bins)
	if width <= 0 {
		return nil
	}
	prompt := make([]float64, bins)
	cached := make([]float64, bins)
	for i := range r.Samples {
		s := &r.Samples[i]
		if !s.ok() {
			continue
		}
		b := min(bins-1, max(0, int(float64(s.Arrival-lo)/width)))
		prompt[b] += float64(s.PromptTokens)
		cached[b] += float64(s.CachedTokens)
	}
	var pts []point
	for b := range bins {
		if prompt[b] > 0 {
			pts = append(pts, point{(time.Duration(lo) + time.Duration((float64(b)+0.5)*width)).Seconds(), cached[b] / prompt[b]})
		}
	}
	return pts
}
