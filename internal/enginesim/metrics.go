package enginesim

import (
	"errors"
	"strconv"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// snapshot is the engine state the metrics read at scrape time, published
// by the engine loop after every step and command.
type snapshot struct {
	// runningLoRAs, waitingLoRAs are the adapters of running and waiting
	// requests (vllm:lora_requests_info).
	runningLoRAs, waitingLoRAs []string
	running, waiting           int
	usage                      float64
	stats                      Stats
}

// metrics are the vLLM metrics an engine exposes (names and labels of
// vllm/v1/metrics/loggers.py: model_name and engine) plus the simulator's
// own, prefixed kvrouter_enginesim_.
type metrics struct {
	ttft          prometheus.Histogram
	e2e           prometheus.Histogram
	prefillTime   prometheus.Histogram
	decodeTime    prometheus.Histogram
	success       *prometheus.CounterVec
	eventBatches  prometheus.Counter
	eventsDropped *prometheus.CounterVec
	replays       prometheus.Counter
	faults        *prometheus.CounterVec
	loraLoads     prometheus.Counter
	// kvTransfer is vLLM's NIXL transfer-duration histogram
	// (NixlPromMetrics in vllm/distributed/kv_transfer/kv_connector/v1/
	// nixl/stats.py): one observation per pull of a decode leg.
	kvTransfer prometheus.Histogram
}

// newMetrics registers the metrics of data-parallel rank on reg (label
// engine, as vLLM labels each DP engine's series); state returns the latest
// snapshot. The cache_config_info labels are those of vLLM's CacheConfig
// that a router reads. The simulator's own series carry the engine label
// too, so that the ranks of one server share a registry.
func newMetrics(reg prometheus.Registerer, model string, cfg CoreConfig, hashAlgo string, state *atomic.Pointer[snapshot], rank int) (*metrics, error) {
	engine := strconv.Itoa(rank)
	labels := prometheus.Labels{"model_name": model, "engine": engine}
	own := prometheus.Labels{"engine": engine}
	get := func() *snapshot { return state.Load() }
	gauge := func(name, help string, f func(s *snapshot) float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels},
			func() float64 { return f(get()) })
	}
	counter := func(name, help string, f func(s *snapshot) int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels},
			func() float64 { return float64(f(get())) })
	}
	// phaseBuckets are vLLM's request_latency_buckets (loggers.py).
	phaseBuckets := []float64{0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960, 1920, 7680}
	buckets := []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}
	m := &metrics{
		ttft: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "vllm:time_to_first_token_seconds",
			Help: "Histogram of time to first token in seconds.", ConstLabels: labels, Buckets: buckets}),
		e2e: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "vllm:e2e_request_latency_seconds",
			Help: "Histogram of end to end request latency in seconds.", ConstLabels: labels, Buckets: buckets}),
		prefillTime: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "vllm:request_prefill_time_seconds",
			Help: "Histogram of time spent in PREFILL phase for request.", ConstLabels: labels, Buckets: phaseBuckets}),
		decodeTime: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "vllm:request_decode_time_seconds",
			Help: "Histogram of time spent in DECODE phase for request.", ConstLabels: labels, Buckets: phaseBuckets}),
		success: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vllm:request_success_total",
			Help: "Count of successfully processed requests.", ConstLabels: labels}, []string{"finished_reason"}),
		eventBatches: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvrouter_enginesim_kv_event_batches_total",
			Help: "KV event batches sent on the PUB socket.", ConstLabels: own}),
		eventsDropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvrouter_enginesim_kv_event_batches_dropped_total",
			Help: "KV event batches not sent, by reason: queue_full (no seq assigned) or fault (drop-every-k, still replayable).", ConstLabels: own},
			[]string{"reason"}),
		replays: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvrouter_enginesim_kv_event_replays_total",
			Help: "Replay requests answered.", ConstLabels: own}),
		loraLoads: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvrouter_enginesim_lora_loads_total",
			Help: "LoRA adapters loaded at run time (POST /v1/load_lora_adapter).", ConstLabels: own}),
		faults: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvrouter_enginesim_faults_injected_total",
			Help: "Injected faults by kind.", ConstLabels: own}, []string{"kind"}),
		kvTransfer: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "vllm:nixl_xfer_time_seconds",
			Help: "Histogram of transfer duration for NIXL KV Cache transfers.", ConstLabels: labels,
			Buckets: []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0}}),
	}
	info := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "vllm:cache_config_info", Help: "Information of the LLMEngine CacheConfig",
		ConstLabels: prometheus.Labels{
			"engine":                   engine,
			"block_size":               strconv.Itoa(cfg.BlockSize),
			"num_gpu_blocks":           strconv.Itoa(cfg.NumGPUBlocks),
			"num_gpu_blocks_override":  strconv.Itoa(cfg.NumGPUBlocks),
			"num_cpu_blocks":           strconv.Itoa(cfg.NumCPUBlocks),
			"enable_prefix_caching":    "True",
			"prefix_caching_hash_algo": hashAlgo,
			"cache_dtype":              "auto",
		}})
	info.Set(1)
	cs := []prometheus.Collector{
		gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
			func(s *snapshot) float64 { return float64(s.running) }),
		gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
			func(s *snapshot) float64 { return float64(s.waiting) }),
		gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
			func(s *snapshot) float64 { return s.usage }),
		counter("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.",
			func(s *snapshot) int64 { return s.stats.PrefixQueries }),
		counter("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.",
			func(s *snapshot) int64 { return s.stats.PrefixHits }),
		counter("vllm:num_preemptions_total", "Cumulative number of preemption from the engine.",
			func(s *snapshot) int64 { return s.stats.Preemptions }),
		counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.",
			func(s *snapshot) int64 { return s.stats.PromptTokens }),
		counter("vllm:generation_tokens_total", "Number of generation tokens processed.",
			func(s *snapshot) int64 { return s.stats.GenerationTokens }),
		info, m.loraLoads, m.ttft, m.e2e, m.prefillTime, m.decodeTime, m.success, m.eventBatches, m.eventsDropped, m.replays, m.faults, m.kvTransfer,
	}
	if cfg.NumCPUBlocks > 0 {
		cs = append(cs,
			counter("vllm:external_prefix_cache_queries_total", "External prefix cache queries from KV connector cross-instance cache sharing, in terms of number of queried tokens.",
				func(s *snapshot) int64 { return s.stats.ExternalQueries }),
			counter("vllm:external_prefix_cache_hits_total", "External prefix cache hits from KV connector cross-instance cache sharing, in terms of number of cached tokens.",
				func(s *snapshot) int64 { return s.stats.ExternalHits }))
	}
	var errs []error
	for _, c := range cs {
		errs = append(errs, reg.Register(c))
	}
	return m, errors.Join(errs...)
}
