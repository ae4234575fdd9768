// Package bench replays a workload open-loop against live servers and
// measures what clients see: a kvrouter (one URL; the replica that served
// each request is read from the x-kvrouter-replica response header), or
// engines directly with a client-side policy as the baseline (round_robin,
// least_load, random).
//
// Each request is sent at its arrival time whether or not earlier ones have
// finished (open loop), as POST /v1/completions with the prompt as token ids,
// "stream": true, "stream_options": {"include_usage": true},
// "ignore_eos": true and max_tokens = the workload's output length, so every
// engine generates exactly the requested tokens. TTFT, gaps between SSE
// chunks (ITL), end-to-end latency, and usage (prompt, completion and cached
// tokens) come from the real streams. Before and after a run the engines'
// /metrics are read; the deltas of vllm:prefix_cache_hits_total /
// vllm:prefix_cache_queries_total give the engines' own hit rate, and of
// vllm:num_preemptions_total the preemptions.
//
// Results are report.Runs (internal/bench/report), the same as the fleet
// simulator's. Run starts one goroutine per in-flight request plus, when a
// progress writer is set, one that redraws a progress bar; all of them have
// returned when Run returns.
package bench
