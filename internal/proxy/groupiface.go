package proxy

import (
	"kvrouter/internal/group"
	"kvrouter/internal/routing"
)

// RankHeader is the request header that pins a request to a data-parallel
// rank of a vLLM engine (group.Decision.DPRank; vLLM:
// vllm/entrypoints/openai/engine/serving.py _get_data_parallel_rank; HTTP
// header names are case-insensitive).
const RankHeader = "X-Data-Parallel-Rank"

// loadReporter is the optional part of a Router that tells a replica's
// current load (group.Backend does); disaggregated serving reads the
// prefill engine's queue and the decode engine's prefill rate from it.
// Without it the rule sees an empty queue and routing's default rates.
type loadReporter interface {
	Load(name string) (routing.Load, bool)
}

var (
	_ loadReporter       = (*group.Backend)(nil)
	_ group.IndexTruster = (*group.Backend)(nil)
)
