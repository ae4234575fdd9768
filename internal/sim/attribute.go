package sim

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"strings"

	"kvrouter/internal/bench/report"
	"kvrouter/internal/enginesim"
	"kvrouter/internal/routing"
	"kvrouter/internal/workload"
)

// decisionRec is what attribution keeps of one routing decision, in blocks
// of the engine's size.
type decisionRec struct {
	// chosen and best are the leading blocks held or predicted on the
	// chosen replica and on the candidate holding the most.
	chosen, best int32
	// decay is set when kv without credit decay (full credit everywhere)
	// would have chosen a candidate holding best blocks instead.
	decay bool
}

// record keeps decision d for a prompt of prompt tokens.
func (f *fleet) record(d *routing.Decision, prompt int) decisionRec {
	var r decisionRec
	if d.Index < 0 {
		return r
	}
	r.chosen = int32(d.Chosen().CachedBlocks)
	for _, t := range d.Terms {
		r.best = max(r.best, int32(t.CachedBlocks))
	}
	if d.Policy != "kv" || r.chosen >= r.best {
		return r
	}
	// Full credit: cost - (new - max(0, prompt - overlap*bs))/rate. The
	// decay decided when a candidate holding best blocks is strictly
	// cheaper than the chosen one at full credit.
	rate := cmp.Or(f.cfg.Routing.PrefillRate, f.cfg.prefillRate())
	bs := float64(f.blockSize())
	full := func(t *routing.Terms) float64 {
		return t.Cost + (math.Max(0, float64(prompt)-t.Overlap*bs)-t.NewTokens)/rate
	}
	chosen := full(&d.Terms[d.Index])
	for j := range d.Terms {
		t := &d.Terms[j]
		if int32(t.CachedBlocks) == r.best && full(t) < chosen-1e-9*math.Max(1, math.Abs(chosen)) {
			r.decay = true
		}
	}
	return r
}

// Attribution splits the prompt tokens a policy's fleet found cached less
// than the pooled-cache bound's, request by request, by cause. Tokens are
// prompt tokens (prefill tokens saved or lost); for request i with bound
// hit B, the policy's hit K, the chosen replica's leading blocks held or
// predicted at the decision C and the best candidate's H (both in tokens,
// capped at B), a loss B - K > 0 is counted as:
//
//	Split    = min(loss, H - C)     placed away from a replica holding more of it
//	InFlight = min(loss - Split, C - K)  held at the decision, gone at admission
//	Evicted  = the rest             no replica held what the pooled LRU kept
//
// and a gain K > B as Above. So Bound - Cached = Split + InFlight + Evicted
// - Above.
type Attribution struct {
	// Policy is the policy's name.
	Policy string
	// Bound and Cached are the pooled bound's and the policy's cached
	// prompt tokens.
	Bound, Cached int64
	// Split, InFlight, Evicted and Above are tokens, as above.
	Split, InFlight, Evicted, Above int64
	// SplitDecay is the part of Split whose decision kv's credit decay
	// changed: with full credit it would have gone to a replica holding
	// the most (kv only).
	SplitDecay int64
	// SplitRequests and EvictedRequests count the requests with some Split
	// and some Evicted tokens.
	SplitRequests, EvictedRequests int
}

// Attribute runs cfg's policies on w with their decisions recorded, and the
// pooled bound, and returns an Attribution for each policy that keeps an
// index (cache-blind policies and cache_greedy record no decisions and are
// left out), in cfg.Policies order, with the runs (as Run returns them).
func Attribute(ctx context.Context, cfg Config, w *workload.Workload) ([]*report.Run, []Attribution, Bound, error) {
	b, err := PooledBound(ctx, cfg, w)
	if err != nil {
		return nil, nil, Bound{}, err
	}
	runs, recs, err := run(ctx, cfg, w, true)
	if err != nil {
		return nil, nil, Bound{}, err
	}
	bs := cfg.Engine.BlockSize
	if bs == 0 {
		bs = enginesim.DefaultBlockSize
	}
	var out []Attribution
	for p, r := range runs {
		if recs[p] == nil {
			continue
		}
		a := Attribution{Policy: r.Policy, Bound: b.CachedTokens}
		for i, s := range r.Samples {
			bound, got := int64(b.CachedPerRequest[i]), int64(s.CachedTokens)
			a.Cached += got
			loss := bound - got
			if loss <= 0 {
				a.Above -= loss
				continue
			}
			d := recs[p][i]
			chosen := min(int64(d.chosen)*int64(bs), bound)
			best := min(int64(d.best)*int64(bs), bound)
			split := min(loss, max(0, best-chosen))
			inflight := min(loss-split, max(0, chosen-got))
			evicted := loss - split - inflight
			a.Split += split
			a.InFlight += inflight
			a.Evicted += evicted
			if split > 0 {
				a.SplitRequests++
				if d.decay {
					a.SplitDecay += split
				}
			}
			if evicted > 0 {
				a.EvictedRequests++
			}
		}
		if a.Bound-a.Cached != a.Split+a.InFlight+a.Evicted-a.Above {
			return nil, nil, Bound{}, fmt.Errorf("sim: attribution of %s does not add up", r.Policy)
		}
		out = append(out, a)
	}
	return runs, out, b, nil
}

// AttributionMarkdown writes as as a markdown table, tokens as shares of
// the pooled bound's cached tokens.
func AttributionMarkdown(as []Attribution) string {
	var b strings.Builder
	b.WriteString("| policy | cached / pooled bound | lost: split (of it decay) | lost: in flight | lost: evicted | gained above the bound | requests split / evicted |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|\n")
	for _, a := range as {
		sh := func(v int64) float64 {
			if a.Bound == 0 {
				return 0
			}
			return float64(v) / float64(a.Bound)
		}
		fmt.Fprintf(&b, "| %s | %.3f | %.3f (%.3f) | %.3f | %.3f | %.3f | %d / %d |\n", a.Policy, sh(a.Cached),
			sh(a.Split), sh(a.SplitDecay), sh(a.InFlight), sh(a.Evicted), sh(a.Above), a.SplitRequests, a.EvictedRequests)
	}
	return b.String()
}
