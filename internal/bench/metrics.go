package bench

import (
	"fmt"
	"io"

	"kvrouter/internal/vllm/enginemetrics"
)

// counters are an engine's cumulative counters (vllm:prefix_cache_hits_total,
// vllm:prefix_cache_queries_total, vllm:num_preemptions_total) at one instant, summed over
// label sets (several models or engines behind one URL).
type counters struct {
	hits, queries, preemptions float64
}

func (c counters) sub(o counters) counters {
	return counters{c.hits - o.hits, c.queries - o.queries, c.preemptions - o.preemptions}
}

func (c *counters) add(o counters) {
	c.hits += o.hits
	c.queries += o.queries
	c.preemptions += o.preemptions
}

// parseCounters reads an engine's /metrics page with enginemetrics.Parse
// and keeps the three counters the bench reports; a page that is not a valid
// exposition is an error wrapping ErrMalformed. Absent metrics count as zero.
func parseCounters(r io.Reader) (counters, error) {
	m, err := enginemetrics.Parse(r)
	if err != nil {
		return counters{}, fmt.Errorf("%w: metrics: %v", ErrMalformed, err)
	}
	return counters{hits: m.PrefixCacheHits, queries: m.PrefixCacheQueries, preemptions: m.Preemptions}, nil
}
