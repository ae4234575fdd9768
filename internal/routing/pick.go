package routing

import (
	"math"

	"kvrouter/internal/kvindex"
)

// costEps is the cost difference below which two candidates tie (relative to
// the cost's magnitude, with an absolute floor).
const costEps = 1e-9

func tied(a, b float64) bool {
	return math.Abs(a-b) <= costEps*math.Max(1, math.Max(math.Abs(a), math.Abs(b)))
}

// lessLoaded orders candidates by load: fewer in-flight requests, then fewer
// queued prefill tokens, then fewer running decode tokens.
func lessLoaded(a, b *Load) int {
	switch {
	case a.InFlight != b.InFlight:
		return cmp64(a.InFlight, b.InFlight)
	case a.QueuedPrefill != b.QueuedPrefill:
		return cmp64(a.QueuedPrefill, b.QueuedPrefill)
	}
	return cmp64(a.RunningDecode, b.RunningDecode)
}

func cmp64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// pickMin chooses the candidate with the lowest d.Terms[i].Cost; ties go to
// the lower load, then uniformly at random (reservoir sampling, so no
// allocation). When rng is nil (Evaluate: no random state consumed) the
// random step is replaced by a deterministic one: the most confirmed cached
// blocks (held, not merely predicted), then the first in candidate order.
// It fills d's choice and returns it.
func pickMin(d *Decision, cands []Candidate, rng *lockedRand) Decision {
	return pickMinStriped(d, cands, rng, false)
}

// pickMinStriped is pickMin; with striped, ties of equal load go to the
// lower stripe rank (Candidate.Stripe: several router replicas; reason
// "tie_stripe") before the random draw. Only kv uses it: measured in
// docs/results/2026-12-01-measurements.md, stripes help kv in every regime but least_load's
// request-count ties not (hot_prefix at 8 routers: 102.0 -> 94.7 req/s).
func pickMinStriped(d *Decision, cands []Candidate, rng *lockedRand, striped bool) Decision {
	best := 0
	for i := 1; i < len(cands); i++ {
		if c := d.Terms[i].Cost; c < d.Terms[best].Cost && !tied(c, d.Terms[best].Cost) {
			best = i
		}
	}
	min := d.Terms[best].Cost
	// Among ties, the least loaded; among those, uniformly at random.
	chosen, n, ties := -1, 0, 0
	for i := range cands {
		if !tied(d.Terms[i].Cost, min) {
			continue
		}
		ties++
		switch {
		case chosen < 0:
			chosen, n = i, 1
		default:
			switch lessLoaded(&cands[i].Load, &cands[chosen].Load) {
			case -1:
				chosen, n = i, 1
			case 0:
				// Then the lower stripe rank (several router replicas).
				if c := cands[i].Stripe - cands[chosen].Stripe; striped && c != 0 {
					if c < 0 {
						chosen, n = i, 1
					}
					break
				}
				n++
				switch {
				case rng == nil:
					if confirmed(&cands[i].Match) > confirmed(&cands[chosen].Match) {
						chosen = i
					}
				case rng.IntN(n) == 0:
					chosen = i
				}
			}
		}
	}
	reason := "min_cost"
	switch {
	case ties > 1 && n > 1:
		reason = "tie_random"
	case ties > 1:
		reason = "tie_load"
		for i := range cands {
			if i != chosen && tied(d.Terms[i].Cost, min) && lessLoaded(&cands[i].Load, &cands[chosen].Load) == 0 {
				reason = "tie_stripe"
				break
			}
		}
	}
	return d.choose(chosen, cands, reason)
}

// confirmed is m's leading blocks held by the engine (not merely predicted).
func confirmed(m *kvindex.Match) int32 { return m.GPU + m.CPU + m.Storage }
