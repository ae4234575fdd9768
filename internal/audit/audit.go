package audit

import (
	"math"
	"sort"
	"time"
)

// Verdict names the audit's conclusion for one model.
type Verdict string

// The verdicts, in the order they are decided.
const (
	// Thrashing: a replica preempts more than ThrashPreemptionShare of its
	// requests; its hit rate counts re-prefill and means little. Size the
	// KV cache first (kvrouter plan).
	Thrashing Verdict = "thrashing"
	// OneReplica: nothing to route between.
	OneReplica Verdict = "one_replica"
	// AlreadyHigh: the hit rate under the current distribution is at least
	// HighHitRate: the reuse is in prefixes every replica holds (a shared
	// system prompt), which any balancer gets; a KV-aware router can add
	// little.
	AlreadyHigh Verdict = "already_high"
	// LowReuse: even a perfect router could add under MinGain of hit rate:
	// the traffic reuses little, or what it reuses is scattered.
	LowReuse Verdict = "low_reuse"
	// WorthIt: a KV-aware router can add at least MinGain of hit rate;
	// EstimatedGain says how much.
	WorthIt Verdict = "worth_it"
	// NoTraffic: no prefix cache queries in the window.
	NoTraffic Verdict = "no_traffic"
)

// Thresholds of the verdicts.
const (
	ThrashPreemptionShare = 0.05
	HighHitRate           = 0.5
	MinGain               = 0.10
)

// Counters are one replica's figures over the window: counter increases
// and the mean KV cache usage.
type Counters struct {
	Queries, Hits       float64 // prefix cache, tokens
	Preemptions         float64 // requests preempted
	Requests            float64 // vllm:request_success_total
	PromptTokens        float64 // vllm:prompt_tokens_total
	ExtQueries, ExtHits float64 // vllm:external_prefix_cache_*_total (KV connector)
	HasExternal         bool
	KVUsage             float64 // mean of vllm:kv_cache_usage_perc, 0..1
	HasKVUsage          bool
}

// Replica is one engine's line of the report. Rates are per second.
type Replica struct {
	Name               string   `json:"name"`
	HitRate            float64  `json:"hit_rate"`
	QueryTokensPerSec  float64  `json:"query_tokens_per_sec"`
	HitTokensPerSec    float64  `json:"hit_tokens_per_sec"`
	RequestsPerSec     float64  `json:"requests_per_sec"`
	PreemptionsPerSec  float64  `json:"preemptions_per_sec"`
	PreemptionShare    float64  `json:"preemptions_per_request"`
	KVUsage            *float64 `json:"kv_usage,omitempty"`
	ExternalHitRate    *float64 `json:"external_hit_rate,omitempty"`
	PromptTokensPerSec float64  `json:"prompt_tokens_per_sec"`
	Warnings           []string `json:"warnings,omitempty"`
}

// Shadow is what kvrouter in shadow mode found: the tokens kv would have
// found cached, of the prompt tokens routed, over the window.
type Shadow struct {
	CachedTokens float64 `json:"cached_tokens"`
	PromptTokens float64 `json:"prompt_tokens"`
	HitRate      float64 `json:"hit_rate"`
}

// Model is one model's report.
type Model struct {
	Model    string    `json:"model"`
	Replicas []Replica `json:"replicas"`
	// HitRate is the fleet's: all hits over all queries (tokens).
	HitRate           float64 `json:"hit_rate"`
	QueryTokensPerSec float64 `json:"query_tokens_per_sec"`
	RequestsPerSec    float64 `json:"requests_per_sec"`
	PreemptionsPerSec float64 `json:"preemptions_per_sec"`
	Shadow            *Shadow `json:"shadow,omitempty"`
	// ReachableHitRate bounds what a perfect router could reach:
	// min(1, replicas * HitRate), or the shadow hit rate when measured.
	ReachableHitRate float64 `json:"reachable_hit_rate"`
	// EstimatedGain is ReachableHitRate - HitRate (hit-rate points), and
	// SavedPrefillTokensPerSec the prefill it would save.
	EstimatedGain            float64 `json:"estimated_gain"`
	SavedPrefillTokensPerSec float64 `json:"saved_prefill_tokens_per_sec"`
	GainMeasured             bool    `json:"gain_measured"`
	Verdict                  Verdict `json:"verdict"`
	Reason                   string  `json:"reason"`
}

// Report is the audit of a fleet.
type Report struct {
	Source        string  `json:"source"`
	WindowSeconds float64 `json:"window_seconds"`
	Models        []Model `json:"models"`
	// Warnings are fleet-wide: metrics that dashboards should no longer read.
	Warnings []string `json:"warnings,omitempty"`
}

// build turns per-replica counters (model -> replica -> counters) into a
// Report with verdicts.
func build(source string, window time.Duration, data map[string]map[string]Counters, shadow map[string]Shadow) Report {
	secs := window.Seconds()
	r := Report{Source: source, WindowSeconds: secs}
	models := make([]string, 0, len(data))
	for m := range data {
		models = append(models, m)
	}
	sort.Strings(models)
	for _, name := range models {
		reps := data[name]
		m := Model{Model: name}
		var q, h, req, pre float64
		names := make([]string, 0, len(reps))
		for n := range reps {
			names = append(names, n)
		}
		sort.Strings(names)
		thrash := ""
		for _, n := range names {
			c := reps[n]
			rep := Replica{Name: n, HitRate: ratio(c.Hits, c.Queries), QueryTokensPerSec: c.Queries / secs,
				HitTokensPerSec: c.Hits / secs, RequestsPerSec: c.Requests / secs, PreemptionsPerSec: c.Preemptions / secs,
				PreemptionShare: ratio(c.Preemptions, c.Requests), PromptTokensPerSec: c.PromptTokens / secs}
			if c.HasKVUsage {
				u := c.KVUsage
				rep.KVUsage = &u
			}
			if c.HasExternal {
				e := ratio(c.ExtHits, c.ExtQueries)
				rep.ExternalHitRate = &e
			}
			if c.Preemptions > 0 {
				rep.Warnings = append(rep.Warnings, "preemptions: their re-prefill counts as prefix cache hits, so this hit rate is inflated")
			}
			if rep.PreemptionShare > ThrashPreemptionShare && thrash == "" {
				thrash = n
			}
			q, h, req, pre = q+c.Queries, h+c.Hits, req+c.Requests, pre+c.Preemptions
			m.Replicas = append(m.Replicas, rep)
		}
		m.HitRate, m.QueryTokensPerSec, m.RequestsPerSec, m.PreemptionsPerSec = ratio(h, q), q/secs, req/secs, pre/secs
		m.ReachableHitRate = math.Min(1, float64(len(reps))*m.HitRate)
		if s, ok := shadow[name]; ok && s.PromptTokens > 0 {
			s.HitRate = ratio(s.CachedTokens, s.PromptTokens)
			m.Shadow = &s
			m.ReachableHitRate, m.GainMeasured = math.Max(s.HitRate, m.HitRate), true
		}
		m.EstimatedGain = m.ReachableHitRate - m.HitRate
		m.SavedPrefillTokensPerSec = m.EstimatedGain * m.QueryTokensPerSec
		m.Verdict, m.Reason = verdict(m, thrash)
		r.Models = append(r.Models, m)
	}
	return r
}

func ratio(a, b float64) float64 {
	if b <= 0 {
		return 0
	}
	return a / b
}
