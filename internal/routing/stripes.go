package routing

import (
	"fmt"
	"math"
)

// stripeRank is the stripe rank (Candidate.Stripe) of the engine at pos in
// the router's name-ordered replica list, for the router of index k among
// n router replicas: its distance, in router replicas, from that router's
// own stripe. Every replica that sees the same engines deals them the same
// way. A Route reads its place once (Stripes) and deals every candidate
// with it, so a concurrent SetStripes never mixes two places.
func stripeRank(pos, n, k int) int {
	if n <= 1 {
		return 0
	}
	return ((pos-k)%n + n) % n
}

func packPlace(routers, index int) uint64 { return uint64(uint32(routers))<<32 | uint64(uint32(index)) }

// Stripes returns the router's place among the router replicas: their
// number and its index (Config.Routers and RouterIndex, or the last
// SetStripes). 1 and 0 (or 0 and 0) mean no stripes.
func (r *Router) Stripes() (routers, index int) {
	v := r.place.Load()
	return int(v >> 32), int(uint32(v))
}

// SetStripes changes the router's place among the router replicas while it
// routes (e.g. as router Pods come and go: discovery.Peers). It is one
// atomic store: a Route that has begun deals its candidates under the old
// or the new place, never a mix of the two, and the next Route uses the
// new one. routers <= 1 turns stripes off (index must then be 0). It
// returns an error, and changes nothing, unless 0 <= index < routers (or
// index is 0). Safe for concurrent use.
func (r *Router) SetStripes(routers, index int) error {
	if routers < 0 || index < 0 || (index > 0 && index >= routers) || routers > math.MaxInt32 {
		return fmt.Errorf("routing: routers %d, router_index %d: want 0 <= router_index < routers", routers, index)
	}
	r.place.Store(packPlace(routers, index))
	return nil
}

// striped reports whether cands fall in more than one stripe: only then do
// the stripe slack and the stripe tie-break choose anything.
func striped(cands []Candidate) bool {
	for i := 1; i < len(cands); i++ {
		if cands[i].Stripe != cands[0].Stripe {
			return true
		}
	}
	return false
}

// stripe returns the candidate KVConfig.StripeSlack picks over the
// cheapest, or -1 when it picks none: among the candidates costing at most
// the slack more than the cheapest and holding no less than the cheapest
// minus an eighth of the prompt (a continuation, or a good part of one, is
// never given up for a stripe), the one of the
// lowest stripe rank, ties to the cheaper; -1 when the cheapest is of that
// rank (pickMin then chooses) or the candidates are all of one stripe
// (one router).
func (p *KV) stripe(d *Decision, cands []Candidate, prompt float64) int {
	slack := p.cfg.StripeSlack.Seconds()
	if slack <= 0 || !striped(cands) {
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
