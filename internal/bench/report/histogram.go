package report

import (
	"math"
	"time"
)

// Histogram counts durations in log-linear buckets: 128 buckets per power of
// two, so a quantile read back is within 1/256 (0.4%) of a recorded value.
// It covers 1 ns to about 2^40 ns (18 minutes); larger values land in the
// last bucket. The zero value is ready to use; it is not safe for
// concurrent use.
type Histogram struct {
	counts []uint64 // lazily sized
	n      uint64
	sum    time.Duration
}

const (
	subBits    = 7
	subBuckets = 1 << subBits
	maxExp     = 41
	numBuckets = maxExp * subBuckets
)

func bucketOf(d time.Duration) int {
	if d < 1 {
		return 0
	}
	frac, exp := math.Frexp(float64(d)) // d = frac * 2^exp, frac in [0.5, 1)
	if exp > maxExp {
		return numBuckets - 1
	}
	return (exp-1)*subBuckets + int((frac-0.5)*2*subBuckets)
}

// bucketMid is the midpoint of bucket i in nanoseconds.
func bucketMid(i int) float64 {
	exp, sub := i/subBuckets+1, i%subBuckets
	lo := math.Ldexp(0.5+float64(sub)/(2*subBuckets), exp)
	hi := math.Ldexp(0.5+float64(sub+1)/(2*subBuckets), exp)
	return (lo + hi) / 2
}

// Add records one duration (negative counts as zero).
func (h *Histogram) Add(d time.Duration) {
	if h.counts == nil {
		h.counts = make([]uint64, numBuckets)
	}
	h.counts[bucketOf(d)]++
	h.n++
	h.sum += max(d, 0)
}

// Merge adds o's counts to h.
func (h *Histogram) Merge(o *Histogram) {
	if o.n == 0 {
		return
	}
	if h.counts == nil {
		h.counts = make([]uint64, numBuckets)
	}
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.sum += o.sum
}

// Count returns the number of recorded durations.
func (h *Histogram) Count() uint64 { return h.n }

// Mean returns the exact mean, or 0 when empty.
func (h *Histogram) Mean() time.Duration {
	if h.n == 0 {
		return 0
	}
	return h.sum / time.Duration(h.n)
}

// Quantile returns the q-quantile (0..1) as the midpoint of the bucket
// holding the order statistic at rank q*(n-1), or 0 when empty.
func (h *Histogram) Quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := uint64(math.Round(q * float64(h.n-1)))
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen > rank {
			return time.Duration(bucketMid(i))
		}
	}
	return time.Duration(bucketMid(numBuckets - 1))
}
