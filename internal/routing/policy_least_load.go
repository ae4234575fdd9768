package routing

// LeastLoad picks the candidate with the fewest in-flight requests from this
// router, plus the engine's waiting requests when its gauges are fresh; ties
// go to fewer queued prefill tokens, then at random. Cache is ignored.
type LeastLoad struct{ rng *lockedRand }

var _ Policy = (*LeastLoad)(nil)

// Pick implements Policy. Cost is in requests.
func (p *LeastLoad) Pick(_ *Request, cands []Candidate) Decision { return p.decide(cands, p.rng) }

// Evaluate implements Evaluator: Pick with ties broken without randomness.
func (p *LeastLoad) Evaluate(_ *Request, cands []Candidate) Decision { return p.decide(cands, nil) }

func (p *LeastLoad) decide(cands []Candidate, rng *lockedRand) Decision {
	d := newDecision("least_load", cands)
	for i := range cands {
		l := &cands[i].Load
		d.Terms[i].Cost = float64(l.InFlight + int64(l.Waiting))
	}
	return pickMin(&d, cands, rng)
}
