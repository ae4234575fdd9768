package routing

// Random picks a candidate uniformly at random (Config.Rand).
type Random struct{ rng *lockedRand }

var _ Policy = (*Random)(nil)

// Pick implements Policy. Every candidate's Cost is 0.
func (p *Random) Pick(_ *Request, cands []Candidate) Decision {
	d := newDecision("random", cands)
	return d.choose(p.rng.IntN(len(cands)), cands, "random")
}

// Evaluate implements Evaluator. The choice being random, it reports the
// first candidate (reason "random") and draws nothing from the source.
func (p *Random) Evaluate(_ *Request, cands []Candidate) Decision {
	d := newDecision("random", cands)
	return d.choose(0, cands, "random")
}
