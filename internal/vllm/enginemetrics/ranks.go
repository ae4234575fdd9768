package enginemetrics

import (
	"slices"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
)

// EngineLoad is one engine's (data-parallel rank's) load, from the series
// whose engine label has that rank's value.
type EngineLoad struct {
	// Running and Waiting are requests (vllm:num_requests_running,
	// vllm:num_requests_waiting).
	Running, Waiting float64
	// KVCacheUsage is the fraction 0..1 of the rank's KV cache in use.
	KVCacheUsage float64
}

// LoRAInfo is the newest vllm:lora_requests_info series. vLLM
// (vllm/v1/metrics/loggers.py, PrometheusStatLogger) sets a gauge with the
// labels max_lora, running_lora_adapters and waiting_lora_adapters (adapter
// names joined by ",") to the current time on every logging interval, so
// each state it passed through stays a series; the one with the largest
// value is the current state.
type LoRAInfo struct {
	// MaxLoRA is --max-loras: adapters one batch can hold at once.
	MaxLoRA int
	// Running and Waiting are the adapter names of running and waiting
	// requests, sorted.
	Running, Waiting []string
}

const (
	metricLoRAInfo      = "vllm:lora_requests_info"
	labelMaxLoRA        = "max_lora"
	labelRunningAdapter = "running_lora_adapters"
	labelWaitingAdapter = "waiting_lora_adapters"
)

// perEngine reads the running, waiting and usage gauges by engine label
// value ("" when the label is absent).
func perEngine(families map[string]*dto.MetricFamily) map[string]EngineLoad {
	out := map[string]EngineLoad{}
	each := func(names []string, set func(l *EngineLoad, v float64)) {
		for _, name := range names {
			mf := families[name]
			if mf == nil || len(mf.GetMetric()) == 0 {
				continue
			}
			for _, s := range mf.GetMetric() {
				e := labelValue(s, labelEngine)
				l := out[e]
				set(&l, sampleValue(s))
				out[e] = l
			}
			return
		}
	}
	each([]string{metricRunning}, func(l *EngineLoad, v float64) { l.Running += v })
	each([]string{metricWaiting}, func(l *EngineLoad, v float64) { l.Waiting += v })
	each([]string{metricKVUsage, metricKVUsageOld}, func(l *EngineLoad, v float64) { l.KVCacheUsage = v })
	if len(out) == 0 {
		return nil
	}
	return out
}

// loraInfo returns the newest vllm:lora_requests_info series, nil when the
// engine exports none (LoRA off).
func loraInfo(families map[string]*dto.MetricFamily) *LoRAInfo {
	mf := families[metricLoRAInfo]
	if mf == nil || len(mf.GetMetric()) == 0 {
		return nil
	}
	var best *dto.Metric
	for _, s := range mf.GetMetric() {
		if best == nil || sampleValue(s) > sampleValue(best) {
			best = s
		}
	}
	return &LoRAInfo{
		MaxLoRA: atoiOrZero(labelValue(best, labelMaxLoRA)),
		Running: adapterList(labelValue(best, labelRunningAdapter)),
		Waiting: adapterList(labelValue(best, labelWaitingAdapter)),
	}
}

func adapterList(s string) []string {
	var out []string
	for n := range strings.SplitSeq(s, ",") {
		if n = strings.TrimSpace(n); n != "" {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

// RankLoad returns the load of data-parallel rank rank: PerEngine's entry
// for the engine label value strconv.Itoa(rank); ok is false when the
// engine exported no series with that label value.
func (m Metrics) RankLoad(rank int) (running, waiting, kvUsage float64, ok bool) {
	l, ok := m.PerEngine[strconv.Itoa(rank)]
	return l.Running, l.Waiting, l.KVCacheUsage, ok
}
