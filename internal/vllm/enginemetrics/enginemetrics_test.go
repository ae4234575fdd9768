package enginemetrics

import (
	"reflect"
	"strings"
	"testing"
)

// sampleMetrics is a hand-written exposition in the shape prometheus_client
// writes for vLLM (HELP/TYPE lines, counters with _total plus a _created
// gauge family, a histogram, cache_config_info with its string labels), for
// a server with two data-parallel engines. It is not captured from a live
// engine.
const sampleMetrics = `# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 1234.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-8B"} 3.0
vllm:num_requests_running{engine="1",model_name="Qwen/Qwen3-8B"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3-8B"} 1.0
vllm:num_requests_waiting{engine="1",model_name="Qwen/Qwen3-8B"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen3-8B"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="Qwen/Qwen3-8B"} 0.25
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="Qwen/Qwen3-8B"} 10000.0
vllm:prefix_cache_queries_total{engine="1",model_name="Qwen/Qwen3-8B"} 5000.0
# HELP vllm:prefix_cache_queries_created Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_created gauge
vllm:prefix_cache_queries_created{engine="0",model_name="Qwen/Qwen3-8B"} 1.7545309541234e+09
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="Qwen/Qwen3-8B"} 6400.0
vllm:prefix_cache_hits_total{engine="1",model_name="Qwen/Qwen3-8B"} 1600.0
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="Qwen/Qwen3-8B"} 2.0
vllm:num_preemptions_total{engine="1",model_name="Qwen/Qwen3-8B"} 1.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="Qwen/Qwen3-8B"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="Qwen/Qwen3-8B"} 7.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="Qwen/Qwen3-8B"} 7.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="Qwen/Qwen3-8B"} 1.25
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="Qwen/Qwen3-8B"} 9000.0
vllm:prompt_tokens_total{engine="1",model_name="Qwen/Qwen3-8B"} 4000.0
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="Qwen/Qwen3-8B"} 700.0
vllm:generation_tokens_total{engine="1",model_name="Qwen/Qwen3-8B"} 300.0
# HELP vllm:request_prefill_time_seconds Histogram of time spent in PREFILL phase for request.
# TYPE vllm:request_prefill_time_seconds histogram
vllm:request_prefill_time_seconds_bucket{engine="0",le="0.3",model_name="Qwen/Qwen3-8B"} 6.0
vllm:request_prefill_time_seconds_bucket{engine="0",le="+Inf",model_name="Qwen/Qwen3-8B"} 7.0
vllm:request_prefill_time_seconds_count{engine="0",model_name="Qwen/Qwen3-8B"} 7.0
vllm:request_prefill_time_seconds_sum{engine="0",model_name="Qwen/Qwen3-8B"} 0.5
vllm:request_prefill_time_seconds_bucket{engine="1",le="0.3",model_name="Qwen/Qwen3-8B"} 3.0
vllm:request_prefill_time_seconds_bucket{engine="1",le="+Inf",model_name="Qwen/Qwen3-8B"} 3.0
vllm:request_prefill_time_seconds_count{engine="1",model_name="Qwen/Qwen3-8B"} 3.0
vllm:request_prefill_time_seconds_sum{engine="1",model_name="Qwen/Qwen3-8B"} 0.25
# HELP vllm:request_decode_time_seconds Histogram of time spent in DECODE phase for request.
# TYPE vllm:request_decode_time_seconds histogram
vllm:request_decode_time_seconds_bucket{engine="0",le="+Inf",model_name="Qwen/Qwen3-8B"} 7.0
vllm:request_decode_time_seconds_count{engine="0",model_name="Qwen/Qwen3-8B"} 7.0
vllm:request_decode_time_seconds_sum{engine="0",model_name="Qwen/Qwen3-8B"} 12.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.9",num_cpu_blocks="None",num_gpu_blocks="27913",prefix_caching_hash_algo="sha256_cbor"} 1.0
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="1",gpu_memory_utilization="0.9",num_cpu_blocks="None",num_gpu_blocks="27913",prefix_caching_hash_algo="sha256_cbor"} 1.0
`

func TestParse(t *testing.T) {
	tests := []struct {
		name string
		text string
		want Metrics
	}{
		{"two engines", sampleMetrics, Metrics{
			Running: 5, Waiting: 1, KVCacheUsage: 0.375, PrefixCacheQueries: 15000,
			PrefixCacheHits: 8000, Preemptions: 3, PromptTokens: 13000, GenerationTokens: 1000,
			PrefillSeconds: 0.75, DecodeSeconds: 12, PrefillComputedTokens: -1,
			BlockSize: 16, NumGPUBlocks: 27913, HashAlgo: "sha256_cbor", Engines: 2,
			PerEngine: map[string]EngineLoad{"0": {Running: 3, Waiting: 1, KVCacheUsage: 0.5}, "1": {Running: 2, KVCacheUsage: 0.25}},
		}},
		{"old names, no engine label, untyped, num_gpu_blocks None", `vllm:num_requests_running{model_name="m"} 1
vllm:num_requests_waiting{model_name="m"} 4
vllm:gpu_cache_usage_perc{model_name="m"} 0.9
vllm:gpu_prefix_cache_queries_total{model_name="m"} 32
vllm:gpu_prefix_cache_hits_total{model_name="m"} 16
vllm:num_preemptions_total{model_name="m"} 0
vllm:cache_config_info{block_size="64.0",num_gpu_blocks="None"} 1
`, Metrics{Running: 1, Waiting: 4, KVCacheUsage: 0.9, PrefixCacheQueries: 32,
			PrefixCacheHits: 16, BlockSize: 64, Engines: 1, PrefillComputedTokens: -1,
			PerEngine: map[string]EngineLoad{"": {Running: 1, Waiting: 4, KVCacheUsage: 0.9}},
			Missing:   []string{metricPromptTokens, metricGenTokens, metricPrefillTime, metricDecodeTime}}},
		{"empty", "", Metrics{PrefillComputedTokens: -1, Missing: []string{metricRunning, metricWaiting, metricKVUsage,
			metricQueries, metricHits, metricPreemptions, metricPromptTokens, metricGenTokens,
			metricPrefillTime, metricDecodeTime, metricCacheConfig}}},
		{"only running", "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 2\n", Metrics{
			Running: 2, Engines: 1, PrefillComputedTokens: -1, PerEngine: map[string]EngineLoad{"": {Running: 2}}, Missing: []string{metricWaiting, metricKVUsage, metricQueries,
				metricHits, metricPreemptions, metricPromptTokens, metricGenTokens, metricPrefillTime,
				metricDecodeTime, metricCacheConfig}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse(strings.NewReader(tt.text))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("\n got %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	for _, text := range []string{
		"vllm:num_requests_running{engine=\"0\" 1\n",
		"vllm:num_requests_running one\n",
		"# TYPE vllm:x gauge\n# TYPE vllm:x counter\nvllm:x 1\n",
	} {
		if _, err := Parse(strings.NewReader(text)); err == nil || !strings.HasPrefix(err.Error(), "parse engine metrics: ") {
			t.Errorf("%q: err = %v, want a parse error", text, err)
		}
	}
}

// FuzzParse checks that the parser never panics and that a
// successful parse is deterministic and self-consistent.
//
//	go test -run '^$' -fuzz FuzzParse -fuzztime 10s ./internal/vllm/
func FuzzParse(f *testing.F) {
	f.Add(sampleMetrics)
	f.Add("vllm:num_requests_running 1\nvllm:cache_config_info{block_size=\"16\"} 1\n")
	f.Add("vllm:kv_cache_usage_perc{engine=\"0\"} NaN\nvllm:kv_cache_usage_perc{engine=\"1\"} +Inf\n")
	f.Fuzz(func(t *testing.T, text string) {
		m, err := Parse(strings.NewReader(text))
		if err != nil {
			return
		}
		if m.BlockSize < 0 || m.NumGPUBlocks < 0 || m.Engines < 0 || len(m.Missing) > 11 {
			t.Fatalf("inconsistent result %+v", m)
		}
		m2, err := Parse(strings.NewReader(text))
		if err != nil || !reflect.DeepEqual(normNaN(m), normNaN(m2)) {
			t.Fatalf("second parse differs: %+v vs %+v (%v)", m, m2, err)
		}
	})
}

// normNaN replaces NaN values so results compare with DeepEqual.
func normNaN(m Metrics) Metrics {
	for _, p := range []*float64{&m.Running, &m.Waiting, &m.KVCacheUsage, &m.PrefixCacheQueries, &m.PrefixCacheHits, &m.Preemptions, &m.PromptTokens, &m.GenerationTokens, &m.PrefillSeconds, &m.DecodeSeconds, &m.PrefillComputedTokens} {
		if *p != *p {
			*p = -1
		}
	}
	if m.PerEngine != nil {
		per := make(map[string]EngineLoad, len(m.PerEngine))
		for k, l := range m.PerEngine {
			for _, p := range []*float64{&l.Running, &l.Waiting, &l.KVCacheUsage} {
				if *p != *p {
					*p = -1
				}
			}
			per[k] = l
		}
		m.PerEngine = per
	}
	return m
}

func TestRateCounters(t *testing.T) {
	m, err := Parse(strings.NewReader(sampleMetrics))
	if err != nil {
		t.Fatal(err)
	}
	pt, ps, dt, ds, ok := m.RateCounters()
	// Computed prompt tokens: 13,000 prompt tokens - 8,000 cache hits.
	if !ok || pt != 5000 || ps != 0.75 || dt != 1000 || ds != 12 {
		t.Errorf("RateCounters = %v %v %v %v %v, want 5000 0.75 1000 12 true", pt, ps, dt, ds, ok)
	}
	withKV := sampleMetrics + `# TYPE vllm:request_prefill_kv_computed_tokens histogram
vllm:request_prefill_kv_computed_tokens_bucket{engine="0",le="+Inf",model_name="Qwen/Qwen3-8B"} 7.0
vllm:request_prefill_kv_computed_tokens_count{engine="0",model_name="Qwen/Qwen3-8B"} 7.0
vllm:request_prefill_kv_computed_tokens_sum{engine="0",model_name="Qwen/Qwen3-8B"} 4321.0
`
	if m, err = Parse(strings.NewReader(withKV)); err != nil {
		t.Fatal(err)
	}
	if pt, _, _, _, ok = m.RateCounters(); !ok || pt != 4321 {
		t.Errorf("with request_prefill_kv_computed_tokens: prefill tokens %v %v, want 4321 true", pt, ok)
	}
	old := strings.ReplaceAll(sampleMetrics, "vllm:request_decode_time_seconds", "vllm:other")
	if m, err = Parse(strings.NewReader(old)); err != nil {
		t.Fatal(err)
	}
	if _, _, _, _, ok = m.RateCounters(); ok {
		t.Error("RateCounters ok without vllm:request_decode_time_seconds")
	}
}
