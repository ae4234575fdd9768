package routing

// Random picks a candidate uniformly at random (Config.Rand).
type Random struct{ rng *lockedRand }

var _ Policy = (*Random)(nil)

// Pick implements Policy. Every candidate's Cost is 0.
func (p *Random) Pick(_ *Request, cands []Candidate) Decision {
	d := newDecision("random", cands)
	return d.choose(p.rng.IntN(len(cands)), cands, "random")
}
