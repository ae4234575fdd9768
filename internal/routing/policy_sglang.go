package routing

// SGLang reimplements sglang router's cache_aware policy with its defaults
// (sgl-project/sglang sgl-router src/policies/cache_aware.rs; CLI defaults
// cache_threshold 0.3, balance_abs_threshold 64, balance_rel_threshold 1.5):
//
//   - the fleet is imbalanced when max_load - min_load > balance_abs_threshold
//     and max_load > balance_rel_threshold * min_load (load = in-flight
//     requests); then the least loaded worker wins, whatever its cache;
//   - otherwise match_rate = matched prefix / request length; above
//     cache_threshold the best-matching worker wins, else the worker with the
//     smallest cache tree (the fewest blocks held), to spread new prefixes.
//
// sglang matches characters in a per-router approximate radix tree of routed
// requests; here the match is this router's index in tokens (matched blocks *
// block size / prompt tokens) and the tree size is Candidate.Held (in-flight
// requests when the index does not report sizes). Ties go at random.
type SGLang struct {
	cfg       SGLangConfig
	blockSize int
	rng       *lockedRand
}

var _ Policy = (*SGLang)(nil)

// Pick implements Policy. Cost is the ranking used by the branch taken:
// in-flight requests (imbalanced), -match rate (prefix), blocks held
// (no_match).
func (p *SGLang) Pick(req *Request, cands []Candidate) Decision { return p.decide(req, cands, p.rng) }

// Evaluate implements Evaluator: Pick with ties broken without randomness.
func (p *SGLang) Evaluate(req *Request, cands []Candidate) Decision {
	return p.decide(req, cands, nil)
}

func (p *SGLang) decide(req *Request, cands []Candidate, rng *lockedRand) Decision {
	d := newDecision("sglang", cands)
	minL, maxL := cands[0].Load.InFlight, cands[0].Load.InFlight
	for i := range cands {
		minL, maxL = min(minL, cands[i].Load.InFlight), max(maxL, cands[i].Load.InFlight)
	}
	if maxL-minL > int64(p.cfg.BalanceAbsThreshold) && float64(maxL) > p.cfg.BalanceRelThreshold*float64(minL) {
		for i := range cands {
			d.Terms[i].Cost = float64(cands[i].Load.InFlight)
		}
		d = pickMin(&d, cands, rng)
		d.Reason = "imbalanced"
		return d
	}
	prompt := float64(req.promptTokens())
	best := 0.0
	for i := range cands {
		rate := 0.0
		if prompt > 0 {
			rate = min(1, float64(cands[i].Match.Blocks()*p.blockSize)/prompt)
		}
		d.Terms[i].Cost = -rate
		best = max(best, rate)
	}
	if best > p.cfg.CacheThreshold {
		d = pickMin(&d, cands, rng)
		d.Reason = "prefix"
		return d
	}
	for i := range cands {
		if h := cands[i].Held; h >= 0 {
			d.Terms[i].Cost = float64(h)
		} else {
			d.Terms[i].Cost = float64(cands[i].Load.InFlight)
		}
	}
	d = pickMin(&d, cands, rng)
	d.Reason = "no_match"
	return d
}
