// Package report turns per-request measurements into kvrouter's comparison
// reports: a markdown table, JSON with a stable schema, and a self-contained
// HTML page with inline SVG plots. Both the fleet simulator (internal/sim)
// and the live benchmark (internal/bench) fill a Run per policy and call New.
//
// Definitions (all times are offsets from the run's start):
//   - hit rate: cached prompt tokens / prompt tokens, over requests that got
//     a first token (what vLLM's prefix_cache_hits/queries count at admission);
//   - TTFT: first token - arrival; e2e: end - arrival; ITL: the gap between
//     consecutive tokens of one stream, pooled over all streams (Histogram,
//     within 0.4% relative error); per-request TPOT = (e2e - TTFT) /
//     (output tokens - 1);
//   - percentiles: linear interpolation between order statistics (numpy's
//     default), in milliseconds;
//   - duration: first arrival to last end; throughput: output tokens of
//     successful requests / duration; goodput: successful requests with
//     TTFT <= SLO.TTFT and TPOT <= SLO.ITL, per second of duration;
//   - load balance (max_mean_load): each replica's busy integral (sum of
//     its requests' e2e, i.e. time-averaged in-flight requests); the
//     largest divided by the mean over all replicas of the run (1 is perfect).
//
// Nothing here starts goroutines; a Run is filled by one goroutine at a time.
package report
