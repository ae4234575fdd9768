package routing

import "math"

// stripe is the stripe rank (Candidate.Stripe) of the engine at pos in the
// router's name-ordered replica list: its distance, in router replicas,
// from this router's own stripe. Every replica that sees the same engines
// deals them the same way.
func (r *Router) stripe(pos int) int {
	n := r.cfg.Routers
	if n <= 1 {
		return 0
	}
	return ((pos-r.cfg.RouterIndex)%n + n) % n
}

// stripe returns the candidate KVConfig.StripeSlack picks over the
// cheapest, or -1 when it picks none: among the candidates costing at most
// the slack more than the cheapest and holding no less than the cheapest
// minus an eighth of the prompt (a continuation, or a good part of one, is
// never given up for a stripe), the one of the
// lowest stripe rank, ties to the cheaper; -1 when the cheapest is of that
// rank (pickMin then chooses) or there is one router.
func (p *KV) stripe(d *Decision, cands []Candidate, prompt float64) int {
	slack := p.cfg.StripeSlack.Seconds()
	if slack <= 0 || p.routers <= 1 {
		return -1
	}
	minCost := math.Inf(1)
	for _, t := range d.Terms {
		minCost = math.Min(minCost, t.Cost)
	}
	atMin := 0.0
	for _, t := range d.Terms {
		if tied(t.Cost, minCost) {
			atMin = math.Max(atMin, t.Overlap)
		}
	}
	best := -1
	for i, t := range d.Terms {
		if t.Cost > minCost+slack || (atMin-t.Overlap)*float64(p.blockSize) >= prompt/8 {
			continue
		}
		if b := best; b < 0 || cands[i].Stripe < cands[b].Stripe || (cands[i].Stripe == cands[b].Stripe && t.Cost < d.Terms[b].Cost) {
			best = i
		}
	}
	if best < 0 || tied(d.Terms[best].Cost, minCost) {
		return -1
	}
	return best
}
