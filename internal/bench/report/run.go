package report

import (
	"math"
	"slices"
	"time"
)

// Sample is the outcome of one request. Times are offsets from the start of
// the run.
type Sample struct {
	// ID is the workload request's id.
	ID string
	// Replica names the replica that served it ("" if none was chosen).
	Replica string
	// Arrival is when the request was sent (or, in the simulator, arrived).
	Arrival time.Duration
	// FirstToken is when the first output token arrived; zero if none did.
	FirstToken time.Duration
	// End is when the response finished or failed.
	End time.Duration
	// PromptTokens is the prompt length; CachedTokens how many of them the
	// engine found in its prefix cache (usage.prompt_tokens_details.cached_tokens).
	PromptTokens, CachedTokens int
	// OutputTokens is the number of tokens received.
	OutputTokens int
	// Err is empty on success, else a short error class ("http_503",
	// "timeout", "rejected", ...).
	Err string
}

// ok reports whether the request completed with at least one token.
func (s *Sample) ok() bool { return s.Err == "" && s.OutputTokens > 0 }

// TTFT returns FirstToken - Arrival.
func (s *Sample) TTFT() time.Duration { return s.FirstToken - s.Arrival }

// TPOT returns the mean time per output token after the first, or 0 for a
// one-token answer.
func (s *Sample) TPOT() time.Duration {
	if s.OutputTokens < 2 {
		return 0
	}
	return (s.End - s.FirstToken) / time.Duration(s.OutputTokens-1)
}

// Run is everything measured for one policy on one workload.
type Run struct {
	// Policy is the policy's name as shown in reports.
	Policy string
	// Samples holds one entry per request, in any order.
	Samples []Sample
	// ITL pools the gaps between consecutive tokens of every stream.
	ITL Histogram
	// Replicas lists every replica that took part (including ones that got
	// no traffic), for load balance and the load plot.
	Replicas []string
	// Preemptions counts engine preemptions during the run (-1: unknown).
	Preemptions int64
	// EngineHitRate is the engines' own hit rate (prefix_cache_hits_total /
	// queries_total deltas); NaN when not measured.
	EngineHitRate float64
	// LateSends counts requests a live replay sent more than LateAfter
	// after their time in the trace: the client could not keep pace, so
	// the offered load was lower and burstier than the trace's. Always 0
	// in the simulator.
	LateSends int
	// MaxLateness is the largest delay between a request's time in the
	// trace and its sending (0 when every request went on time).
	MaxLateness time.Duration
}

// LateAfter is how long after its time in the trace a live replay may send
// a request before it counts in Run.LateSends.
const LateAfter = 50 * time.Millisecond

// FellBehind reports whether more than one request in twenty was sent late:
// the replay did not follow the trace and its latencies measure the
// machine's load as much as the policy.
func (r *Run) FellBehind() bool { return r.LateSends*20 > len(r.Samples) }

// SLO is the service level that goodput counts against.
type SLO struct {
	// TTFT bounds time to first token.
	TTFT time.Duration
	// ITL bounds the per-request mean gap between tokens (TPOT).
	ITL time.Duration
}

// Quantiles holds p50, p90 and p99 in milliseconds.
type Quantiles struct {
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
	P99 float64 `json:"p99"`
}

// PolicyResult is one policy's row of a report; its JSON form is the stable
// schema of "kvrouter sim --json" and "kvrouter bench --json". Fields may be
// added, never renamed.
type PolicyResult struct {
	Name           string    `json:"name"`
	Requests       int       `json:"requests"`
	Errors         int       `json:"errors"`
	HitRate        float64   `json:"hit_rate"`
	TTFT           Quantiles `json:"ttft_ms"`
	ITL            Quantiles `json:"itl_ms"`
	E2E            Quantiles `json:"e2e_ms"`
	ThroughputTokS float64   `json:"throughput_tok_s"`
	GoodputRPS     float64   `json:"goodput_rps"`
	MaxMeanLoad    float64   `json:"max_mean_load"`
	Preemptions    int64     `json:"preemptions"`
	// EngineHitRate is present only when engines' /metrics were read.
	EngineHitRate *float64 `json:"engine_hit_rate,omitempty"`
	// DurationS is the first arrival to the last end, in seconds.
	DurationS float64 `json:"duration_s"`
	// CachedTokens sums the cached prompt tokens of the completed requests
	// (the numerator of HitRate): prefill tokens saved.
	CachedTokens int64 `json:"cached_tokens"`
	// ShareOfPooledBound is CachedTokens over the pooled-cache bound's
	// cached tokens (Report.SetPooledBound); absent without that bound.
	ShareOfPooledBound *float64 `json:"share_of_pooled_bound,omitempty"`
}

// Summarize computes a run's row under slo.
func Summarize(r *Run, slo SLO) PolicyResult {
	res := PolicyResult{Name: r.Policy, Requests: len(r.Samples), Preemptions: r.Preemptions}
	if !math.IsNaN(r.EngineHitRate) {
		v := r.EngineHitRate
		res.EngineHitRate = &v
	}
	if len(r.Samples) == 0 {
		return res
	}
	var ttft, e2e []float64
	var prompt, cached, out int64
	var good int
	first, last := r.Samples[0].Arrival, r.Samples[0].End
	for i := range r.Samples {
		s := &r.Samples[i]
		first, last = min(first, s.Arrival), max(last, s.End)
		if !s.ok() {
			res.Errors++
			continue
		}
		ttft = append(ttft, ms(s.TTFT()))
		e2e = append(e2e, ms(s.End-s.Arrival))
		prompt += int64(s.PromptTokens)
		cached += int64(s.CachedTokens)
		out += int64(s.OutputTokens)
		if s.TTFT() <= slo.TTFT && s.TPOT() <= slo.ITL {
			good++
		}
	}
	res.CachedTokens = cached
	if prompt > 0 {
		res.HitRate = float64(cached) / float64(prompt)
	}
	res.TTFT = quantiles(ttft)
	res.E2E = quantiles(e2e)
	res.ITL = Quantiles{ms(r.ITL.Quantile(0.5)), ms(r.ITL.Quantile(0.9)), ms(r.ITL.Quantile(0.99))}
	if d := (last - first).Seconds(); d > 0 {
		res.DurationS = d
		res.ThroughputTokS = float64(out) / d
		res.GoodputRPS = float64(good) / d
	}
	res.MaxMeanLoad = maxMeanLoad(r)
	return res
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func quantiles(v []float64) Quantiles {
	slices.Sort(v)
	return Quantiles{Percentile(v, 0.5), Percentile(v, 0.9), Percentile(v, 0.99)}
}

// Percentile returns the q-quantile (0..1) of sorted values by linear
// interpolation between the order statistics at floor and ceil of q*(n-1);
// 0 for no values.
func Percentile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	pos := q * float64(len(sorted)-1)
	lo := int(math.Floor(pos))
	hi := min(lo+1, len(sorted)-1)
	return sorted[lo] + (sorted[hi]-sorted[lo])*(pos-float64(lo))
}

// busy returns each replica's busy integral (sum of e2e of its requests) in
// seconds, indexed like names (Replicas, then any replica seen only in
// samples).
func busy(r *Run) (names []string, secs []float64) {
	idx := map[string]int{}
	names = append(names, r.Replicas...)
	for i, n := range names {
		idx[n] = i
	}
	secs = make([]float64, len(names))
	for i := range r.Samples {
		s := &r.Samples[i]
		if s.Replica == "" {
			continue
		}
		j, ok := idx[s.Replica]
		if !ok {
			j = len(names)
			idx[s.Replica] = j
			names = append(names, s.Replica)
			secs = append(secs, 0)
		}
		secs[j] += (s.End - s.Arrival).Seconds()
	}
	return names, secs
}

func maxMeanLoad(r *Run) float64 {
	_, secs := busy(r)
	if len(secs) == 0 {
		return 0
	}
	var sum, mx float64
	for _, v := range secs {
		sum += v
		mx = max(mx, v)
	}
	if sum == 0 {
		return 0
	}
	return mx / (sum / float64(len(secs)))
}
