package bench

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"math"
	"strconv"
)

// Engine counters read from /metrics (vLLM names; docs/vllm-interface.md §4).
const (
	metricHits        = "vllm:prefix_cache_hits_total"
	metricQueries     = "vllm:prefix_cache_queries_total"
	metricPreemptions = "vllm:num_preemptions_total"
)

// counters are an engine's cumulative counters at one instant, summed over
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

// maxMetricsLine bounds one exposition line.
const maxMetricsLine = 1 << 20

// parseCounters reads the Prometheus text exposition format (version
// 0.0.4) and sums the samples of the three engine counters. Other metrics,
// comments and blank lines are skipped. A sample line of one of those
// metrics whose value does not parse, or a line longer than 1 MiB, is an
// error wrapping ErrMalformed. Absent metrics count as zero.
func parseCounters(r io.Reader) (counters, error) {
	var c counters
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxMetricsLine)
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		name, rest := splitName(line)
		var dst *float64
		switch string(name) {
		case metricHits:
			dst = &c.hits
		case metricQueries:
			dst = &c.queries
		case metricPreemptions:
			dst = &c.preemptions
		default:
			continue
		}
		v, err := sampleValue(rest)
		if err != nil {
			return c, fmt.Errorf("%w: metrics line %d: %v", ErrMalformed, n, err)
		}
		*dst += v
	}
	if err := sc.Err(); err != nil {
		return c, fmt.Errorf("%w: metrics: %v", ErrMalformed, err)
	}
	return c, nil
}

// splitName returns the metric name and what follows it (labels, value,
// timestamp).
func splitName(line []byte) (name, rest []byte) {
	i := bytes.IndexAny(line, "{ \t")
	if i < 0 {
		return line, nil
	}
	return line[:i], line[i:]
}

// sampleValue parses "{labels} value [timestamp]" or " value [timestamp]".
func sampleValue(rest []byte) (float64, error) {
	if len(rest) > 0 && rest[0] == '{' {
		end := labelsEnd(rest)
		if end < 0 {
			return 0, fmt.Errorf("unterminated label set")
		}
		rest = rest[end+1:]
	}
	f := bytes.Fields(rest)
	if len(f) == 0 || len(f) > 2 {
		return 0, fmt.Errorf("want value [timestamp], got %q", rest)
	}
	v, err := strconv.ParseFloat(string(f[0]), 64)
	if err != nil {
		return 0, fmt.Errorf("value %q: %v", f[0], err)
	}
	if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
		return 0, fmt.Errorf("counter value %v", v)
	}
	return v, nil
}

// labelsEnd returns the index of the '}' closing the label set that starts
// rest, honouring quoted values with backslash escapes, or -1.
func labelsEnd(rest []byte) int {
	inQuote := false
	for i := 1; i < len(rest); i++ {
		switch c := rest[i]; {
		case inQuote && c == '\\':
			i++
		case c == '"':
			inQuote = !inQuote
		case !inQuote && c == '}':
			return i
		}
	}
	return -1
}
