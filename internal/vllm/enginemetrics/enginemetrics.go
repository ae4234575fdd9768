package enginemetrics

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Metrics is a snapshot of the load and cache figures a vLLM engine
// exposes on GET /metrics (vllm/v1/metrics/loggers.py, main 2026-08-07).
// A server running several engines (data parallelism) labels each series
// with engine="0", "1", ...; counts are summed over engines and models.
type Metrics struct {
	// Running and Waiting are requests (vllm:num_requests_running,
	// vllm:num_requests_waiting), summed over engines.
	Running, Waiting float64
	// KVCacheUsage is the fraction 0..1 of KV cache blocks in use
	// (vllm:kv_cache_usage_perc; vllm:gpu_cache_usage_perc on old
	// engines), averaged over engines since a sum of fractions means
	// nothing.
	KVCacheUsage float64
	// PrefixCacheQueries and PrefixCacheHits are counters in tokens
	// (vllm:prefix_cache_queries_total, vllm:prefix_cache_hits_total; the
	// vllm:gpu_prefix_cache_*_total names of older engines are accepted).
	// Hit rate = rate(hits) / rate(queries); re-prefill after preemption
	// counts as hits, so read it next to Preemptions.
	PrefixCacheQueries, PrefixCacheHits float64
	// Preemptions counts preempted requests (vllm:num_preemptions_total).
	Preemptions float64
	// PromptTokens and GenerationTokens are token counters
	// (vllm:prompt_tokens_total, vllm:generation_tokens_total).
	PromptTokens, GenerationTokens float64
	// PrefillSeconds and DecodeSeconds are the _sum of the histograms
	// vllm:request_prefill_time_seconds (first scheduled to first token)
	// and vllm:request_decode_time_seconds (first token to finish),
	// observed once per finished request (PrometheusStatLogger.record).
	PrefillSeconds, DecodeSeconds float64
	// PrefillComputedTokens is the _sum of
	// vllm:request_prefill_kv_computed_tokens (prompt tokens computed, not
	// found in the prefix cache), on engines that have it; -1 when absent.
	PrefillComputedTokens float64
	// BlockSize (tokens), NumGPUBlocks and HashAlgo come from the labels
	// block_size, num_gpu_blocks and prefix_caching_hash_algo of
	// vllm:cache_config_info (first engine's; 0 or "" when absent or not
	// a number, e.g. "None" before the cache is sized). NumGPUBlocks is
	// per engine.
	BlockSize, NumGPUBlocks int
	HashAlgo                string
	// Engines is the number of distinct engine label values seen (1 when
	// the label is absent but metrics are present, 0 when none are).
	Engines int
	// PerEngine is the load of each engine (data-parallel rank) by its
	// engine label value ("0", "1", ...; "" when unlabelled); nil when no
	// load gauge was found.
	PerEngine map[string]EngineLoad
	// LoRA is the newest vllm:lora_requests_info series; nil when the
	// engine exports none (started without --enable-lora).
	LoRA *LoRAInfo
	// Missing lists the load and cache metrics above that were not found,
	// by their current name, so a caller can tell 0 from absent.
	Missing []string
}

// Metric names, as vLLM exposes them.
const (
	metricRunning        = "vllm:num_requests_running"
	metricWaiting        = "vllm:num_requests_waiting"
	metricKVUsage        = "vllm:kv_cache_usage_perc"
	metricKVUsageOld     = "vllm:gpu_cache_usage_perc"
	metricQueries        = "vllm:prefix_cache_queries_total"
	metricQueriesOld     = "vllm:gpu_prefix_cache_queries_total"
	metricHits           = "vllm:prefix_cache_hits_total"
	metricHitsOld        = "vllm:gpu_prefix_cache_hits_total"
	metricPreemptions    = "vllm:num_preemptions_total"
	metricCacheConfig    = "vllm:cache_config_info"
	metricPromptTokens   = "vllm:prompt_tokens_total"
	metricGenTokens      = "vllm:generation_tokens_total"
	metricPrefillTime    = "vllm:request_prefill_time_seconds"
	metricDecodeTime     = "vllm:request_decode_time_seconds"
	metricPrefillKV      = "vllm:request_prefill_kv_computed_tokens"
	labelEngine          = "engine"
	labelBlockSize       = "block_size"
	labelNumGPUBlocks    = "num_gpu_blocks"
	labelPrefixCacheAlgo = "prefix_caching_hash_algo"
)

// Parse reads a Prometheus text exposition (format 0.0.4, what
// vLLM's prometheus_client writes for a plain GET /metrics) and extracts
// Metrics. Names containing colons are valid legacy Prometheus names;
// the parser runs with model.LegacyValidation. Other metrics are ignored.
// It fails only when the text is not a valid exposition.
func Parse(r io.Reader) (Metrics, error) {
	var m Metrics
	p := expfmt.NewTextParser(model.LegacyValidation)
	families, err := p.TextToMetricFamilies(r)
	if err != nil {
		return m, fmt.Errorf("parse engine metrics: %w", err)
	}
	engines := map[string]struct{}{}
	// sum adds up a family's samples and records engine label values. ok is
	// false when the family is absent or has no samples.
	sum := func(names ...string) (total float64, n int, ok bool) {
		for _, name := range names {
			mf := families[name]
			if mf == nil || len(mf.GetMetric()) == 0 {
				continue
			}
			for _, s := range mf.GetMetric() {
				total += sampleValue(s)
				engines[labelValue(s, labelEngine)] = struct{}{}
				n++
			}
			return total, n, true
		}
		return 0, 0, false
	}
	var ok bool
	if m.Running, _, ok = sum(metricRunning); !ok {
		m.Missing = append(m.Missing, metricRunning)
	}
	if m.Waiting, _, ok = sum(metricWaiting); !ok {
		m.Missing = append(m.Missing, metricWaiting)
	}
	usage, n, ok := sum(metricKVUsage, metricKVUsageOld)
	if ok {
		m.KVCacheUsage = usage / float64(n)
	} else {
		m.Missing = append(m.Missing, metricKVUsage)
	}
	if m.PrefixCacheQueries, _, ok = sum(metricQueries, metricQueriesOld); !ok {
		m.Missing = append(m.Missing, metricQueries)
	}
	if m.PrefixCacheHits, _, ok = sum(metricHits, metricHitsOld); !ok {
		m.Missing = append(m.Missing, metricHits)
	}
	if m.Preemptions, _, ok = sum(metricPreemptions); !ok {
		m.Missing = append(m.Missing, metricPreemptions)
	}
	if m.PromptTokens, _, ok = sum(metricPromptTokens); !ok {
		m.Missing = append(m.Missing, metricPromptTokens)
	}
	if m.GenerationTokens, _, ok = sum(metricGenTokens); !ok {
		m.Missing = append(m.Missing, metricGenTokens)
	}
	if m.PrefillSeconds, ok = histSum(families[metricPrefillTime]); !ok {
		m.Missing = append(m.Missing, metricPrefillTime)
	}
	if m.DecodeSeconds, ok = histSum(families[metricDecodeTime]); !ok {
		m.Missing = append(m.Missing, metricDecodeTime)
	}
	if m.PrefillComputedTokens, ok = histSum(families[metricPrefillKV]); !ok {
		m.PrefillComputedTokens = -1
	}
	if mf := families[metricCacheConfig]; mf != nil && len(mf.GetMetric()) > 0 {
		s := mf.GetMetric()[0]
		m.BlockSize = atoiOrZero(labelValue(s, labelBlockSize))
		m.NumGPUBlocks = atoiOrZero(labelValue(s, labelNumGPUBlocks))
		m.HashAlgo = labelValue(s, labelPrefixCacheAlgo)
	} else {
		m.Missing = append(m.Missing, metricCacheConfig)
	}
	m.Engines = len(engines)
	m.PerEngine = perEngine(families)
	m.LoRA = loraInfo(families)
	return m, nil
}

// histSum adds up the _sum of a histogram family's samples (every engine
// and model); ok is false when the family is absent, empty or not a
// histogram.
func histSum(mf *dto.MetricFamily) (float64, bool) {
	if mf == nil || len(mf.GetMetric()) == 0 {
		return 0, false
	}
	total := 0.0
	for _, s := range mf.GetMetric() {
		h := s.GetHistogram()
		if h == nil {
			return 0, false
		}
		total += h.GetSampleSum()
	}
	return total, true
}

// sampleValue returns a gauge, counter or untyped sample's value.
func sampleValue(s *dto.Metric) float64 {
	switch {
	case s.GetGauge() != nil:
		return s.GetGauge().GetValue()
	case s.GetCounter() != nil:
		return s.GetCounter().GetValue()
	case s.GetUntyped() != nil:
		return s.GetUntyped().GetValue()
	}
	return 0
}

func labelValue(s *dto.Metric, name string) string {
	for _, l := range s.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// atoiOrZero parses a non-negative decimal int label ("16"), also in the
// float form Python may print ("16.0"); anything else is 0.
func atoiOrZero(s string) int {
	if n, err := strconv.Atoi(s); err == nil && n >= 0 {
		return n
	}
	if f, err := strconv.ParseFloat(s, 64); err == nil && f >= 0 && f <= math.MaxInt32 && f == math.Trunc(f) {
		return int(f)
	}
	return 0
}

// RateCounters returns the cumulative counters a router learns an engine's
// throughput from: prompt tokens computed (PrefillComputedTokens, else
// PromptTokens minus PrefixCacheHits: hits after a preemption then count
// against the prefill, a small low bias), prefill seconds, generated tokens
// and decode seconds. ok is false when any of them is missing (an engine
// too old to have the phase histograms).
func (m Metrics) RateCounters() (prefillTokens, prefillSeconds, decodeTokens, decodeSeconds float64, ok bool) {
	for _, name := range []string{metricPromptTokens, metricGenTokens, metricPrefillTime, metricDecodeTime} {
		if slices.Contains(m.Missing, name) {
			return 0, 0, 0, 0, false
		}
	}
	prefillTokens = m.PrefillComputedTokens
	if prefillTokens < 0 {
		if slices.Contains(m.Missing, metricHits) {
			return 0, 0, 0, 0, false
		}
		prefillTokens = math.Max(0, m.PromptTokens-m.PrefixCacheHits)
	}
	return prefillTokens, m.PrefillSeconds, m.GenerationTokens, m.DecodeSeconds, true
}

// CacheConfig returns BlockSize (tokens), NumGPUBlocks (per engine) and
// Engines: the cache figures a router sizes its index by.
func (m Metrics) CacheConfig() (blockSize, gpuBlocks, engines int) {
	return m.BlockSize, m.NumGPUBlocks, m.Engines
}

// Load returns Running and Waiting (requests, summed over engines) and
// KVCacheUsage (fraction 0..1, averaged over engines).
func (m Metrics) Load() (running, waiting, kvUsage float64) {
	return m.Running, m.Waiting, m.KVCacheUsage
}
