// Package audit answers, from a fleet's own vLLM counters, whether its
// traffic deserves a KV-aware router. It reads either a Prometheus HTTP API
// (increase() over a window) or the engines' /metrics directly (samples
// over a window), and reports per replica and per model: the prefix cache
// hit rate in tokens (vllm:prefix_cache_hits_total /
// vllm:prefix_cache_queries_total), preemptions (vllm:num_preemptions_total,
// whose re-prefill counts as hits), KV cache usage
// (vllm:kv_cache_usage_perc), request and prompt token rates, the external
// connector's counters when present, and, when kvrouter runs in shadow
// mode, what kv would have found cached. Metric names: vLLM main
// 2026-08-07, vllm/v1/metrics/loggers.py.
//
// The verdict follows the cases where the field advises against a KV-aware
// router (Verdict). Its gain estimate without shadow data is a bound, not a
// measurement: under blind distribution over N replicas a request finds its
// prefix with probability at least 1/N, so the hit rate a perfect router
// could reach is at most N times the observed one (and at most 1).
//
// Audit and Sample block on HTTP and take a context; nothing here starts a
// goroutine that outlives a call. Safe for concurrent use.
package audit
