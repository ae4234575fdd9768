// Package enginemetrics reads the gauges and counters a vLLM engine exposes
// on GET /metrics (Prometheus text format, metric names with colons, labels
// model_name and engine): requests running and waiting, KV cache usage,
// prefix-cache queries and hits in tokens, preemptions, and the cache
// configuration (block size, number of GPU blocks, hash algorithm) from
// vllm:cache_config_info. Source: vLLM main 2026-08-07, vllm/v1/metrics/loggers.py.
// It is stateless and safe for concurrent use.
package enginemetrics
