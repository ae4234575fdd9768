package routing

import "math"

// KV is kvrouter's default policy: it costs each candidate in seconds of time
// to first token and picks the cheapest (design.md "Cost of a replica"):
//
//	overlap  = GPUWeight*gpu + PredictedWeight*predicted + CPUWeight*cpu + StorageWeight*storage
//	backlog  = queued_prefill/prefill_rate + waiting_penalty*waiting
//	credit   = decay * overlap * block_size,  decay = exp(-(backlog - min backlog)/CreditDecay)
//	new      = max(0, prompt_tokens - credit)
//	cost     = (queued_prefill + new)/prefill_rate
//	         + DecodeWeight*running_decode/decode_rate + waiting_penalty*waiting
//
// The load terms make cache affinity yield once queueing costs more than
// recomputing (no hot spot); the decay lets an idle or new replica win
// requests whose cache sits on busier replicas (warm-up), while a request
// whose best replica is the idlest keeps its full credit however hot other
// replicas are. Prompts shorter than a block have no overlap and go by load.
// Then the affinity slack (KVConfig.AffinitySlack) lets the candidate
// holding at least half the prompt more than every other candidate win when
// it costs at most the slack more and carries at most AffinityLoadCap times
// the other candidates' mean in-flight requests (plus one): the cost is myopic (this request's
// time to first token), while splitting a conversation also spends the
// other replica's prefill on a second copy of its prefix and leaves the next
// turn two places to miss (measured against the pooled-cache bound in
// docs/results/2026-12-01-measurements.md). A prefix several replicas hold (a shared system
// prompt) buys no stickiness, and the load cap spreads one that only one
// replica holds yet every client wants. With several router replicas
// (Config.Routers) the stripe slack then sends near-equal choices to this
// replica's own stripe (stripes.go). Ties go to the lower load, then
// (several routers) the lower stripe rank, then at
// random.
//
// Conversations (Request.SessionKey; docs/routing.md "Conversations and
// cache pressure"): kv remembers each conversation's replica, its home,
// where it stays while home holds more of its prompt than any other
// replica (affinity, without the load cap, and past the slack when no
// cheaper replica has room), or while no replica holds any of it, home
// costs at most KVConfig.EmptyHomeSlack more than the cheapest and no
// cheaper replica has room; a conversation's first
// request goes to the replica with the fewest conversations within
// KVConfig.SessionSpread of the cheapest; and the cost adds the cache
// pressure (Terms.Evict): the blocks a placement writes beyond the
// replica's free room, priced as their recompute.
type KV struct {
	cfg       KVConfig
	blockSize int
	maxTokens int // Config.DefaultMaxTokens
	rng       *lockedRand
	sessions  *sessionMemory // nil: AffinitySessions off
}

var _ Policy = (*KV)(nil)

func newKV(cfg Config, rng *lockedRand) *KV {
	return &KV{cfg: cfg.KV, blockSize: cfg.BlockSize, maxTokens: cfg.DefaultMaxTokens, rng: rng,
		sessions: newSessionMemory(cfg.KV.AffinitySessions)}
}

// Pick implements Policy. Cost is in seconds. It remembers the chosen
// replica as the conversation's (KVConfig.AffinitySessions).
func (p *KV) Pick(req *Request, cands []Candidate) Decision {
	d := p.decide(req, cands, p.rng)
	if d.Index >= 0 {
		p.sessions.remember(req.SessionKey, d.Name)
	}
	return d
}

// Evaluate implements Evaluator: Pick with ties broken without randomness,
// remembering nothing.
func (p *KV) Evaluate(req *Request, cands []Candidate) Decision { return p.decide(req, cands, nil) }

func (p *KV) decide(req *Request, cands []Candidate, rng *lockedRand) Decision {
	d := newDecision("kv", cands)
	c := &p.cfg
	wait := c.WaitingPenalty.Seconds()
	if wait < 0 {
		wait = 0
	}
	backlog := func(l *Load) float64 {
		return float64(l.QueuedPrefill)/rate(l.PrefillRate) + wait*float64(l.Waiting)
	}
	minBacklog := math.Inf(1)
	for i := range cands {
		minBacklog = math.Min(minBacklog, backlog(&cands[i].Load))
	}
	prompt := float64(req.promptTokens())
	meanRate := 0.0 // where an evicted block's recompute lands is not known
	for i := range cands {
		meanRate += rate(cands[i].Load.PrefillRate) / float64(len(cands))
	}
	tau := c.CreditDecay.Seconds()
	for i := range cands {
		m, l, t := &cands[i].Match, &cands[i].Load, &d.Terms[i]
		t.Overlap = pos(c.GPUWeight)*float64(m.GPU) + pos(c.PredictedWeight)*float64(m.Predicted) +
			pos(c.CPUWeight)*float64(m.CPU) + pos(c.StorageWeight)*float64(m.Storage)
		decay := 1.0
		if tau > 0 {
			decay = math.Exp(-(backlog(l) - minBacklog) / tau)
		}
		t.Credit = decay * t.Overlap * float64(p.blockSize)
		t.NewTokens = math.Max(0, prompt-t.Credit)
		t.Evict = p.pressure(req, &cands[i], prompt, meanRate)
		t.Cost = (float64(l.QueuedPrefill)+t.NewTokens)/rate(l.PrefillRate) +
			pos(c.DecodeWeight)*float64(l.RunningDecode)/rate(l.DecodeRate) +
			wait*float64(l.Waiting) + t.Evict
	}
	if i := p.affinity(&d, req, cands, prompt); i >= 0 {
		return d.choose(i, cands, "affinity")
	}
	if i := p.spread(&d, req, cands); i >= 0 {
		return d.choose(i, cands, "spread")
	}
	if i := p.stripe(&d, cands, prompt); i >= 0 {
		return d.choose(i, cands, "stripe")
	}
	return pickMinStriped(&d, cands, rng, striped(cands))
}

// spread returns, for the first request of a conversation (a session key
// kv does not remember), the candidate with the fewest remembered
// conversations among those costing at most SessionSpread more than the
// cheapest, those with room for it (Terms.Evict 0) first, ties to the
// cheaper; or -1 when the candidates in reach do not differ. A
// conversation's history grows on the replica that takes its first turn,
// so conversations spread evenly spread the caches' future load; the cost
// alone would send every new conversation to the replica that holds their
// shared system prompt, a prefill saving of a fraction of a second, until
// its cache overflows with their histories.
func (p *KV) spread(d *Decision, req *Request, cands []Candidate) int {
	w := p.cfg.SessionSpread.Seconds()
	if w <= 0 || p.sessions == nil || req.SessionKey == "" || len(cands) < 2 ||
		p.sessions.replica(req.SessionKey) != "" {
		return -1
	}
	var buf [16]int
	n := p.sessions.sessions(cands, buf[:0])
	minCost := math.Inf(1)
	for _, t := range d.Terms {
		minCost = math.Min(minCost, t.Cost)
	}
	best, differ := -1, false
	for i, t := range d.Terms {
		if t.Cost > minCost+w {
			continue
		}
		if best >= 0 && (n[i] != n[best] || (t.Evict > 0) != (d.Terms[best].Evict > 0)) {
			differ = true
		}
		if best < 0 {
			best = i
			continue
		}
		full, bestFull := t.Evict > 0, d.Terms[best].Evict > 0
		if (!full && bestFull) || (full == bestFull && (n[i] < n[best] || (n[i] == n[best] && t.Cost < d.Terms[best].Cost))) {
			best = i
		}
	}
	if best < 0 || !differ {
		return -1 // nothing to spread: the usual choice and tie-breaks
	}
	return best
}

// pressure is candidate c's cache pressure in seconds (Terms.Evict): the
// blocks placing req there writes beyond c's free room, each worth
// block_size/fleetRate seconds of a later prefill, times EvictWeight.
// fleetRate is the candidates' mean prefill rate: an evicted block is
// recomputed wherever its next request goes, which is not known here (with
// c's own rate, learned rates' errors on a mixed fleet moved more choices:
// goodput 0.956x of known rates' against 0.992x).
// The blocks written are the prompt's beyond those c holds on GPU or has
// predicted, the output, and for a conversation (a session key) its prompt
// once more: its next turn extends the whole prompt on the same replica,
// so a conversation placed on a full cache pushes out other conversations'
// histories turn after turn, while one placed where there is room does not.
// 0 when c's capacity or held blocks are unknown.
func (p *KV) pressure(req *Request, c *Candidate, prompt, fleetRate float64) float64 {
	w := p.cfg.EvictWeight
	if w <= 0 || c.Capacity <= 0 || c.Held < 0 || p.blockSize <= 0 {
		return 0
	}
	bs := float64(p.blockSize)
	out := float64(req.MaxTokens)
	if out <= 0 {
		out = float64(p.maxTokens)
	}
	write := math.Max(0, prompt-float64(c.Match.GPU+c.Match.Predicted)*bs) + out
	if req.SessionKey != "" {
		write += prompt
	}
	room := float64(max(0, c.Capacity-c.Held))
	evicted := math.Max(0, math.Ceil(write/bs)-room)
	return w * evicted * bs / rate(fleetRate)
}

// affinity returns the candidate AffinitySlack picks over the cheapest, or
// -1 when it picks none. Only the candidate holding the most can win, and
// only by what it holds beyond every other candidate: a prefix two replicas
// hold already has its second copy, so cost alone decides between them.
// A conversation kv remembers (AffinitySessions) stays on its replica
// under the rules of home, without the load cap (the cap spreads a prefix
// every client wants; a conversation is one client); for a new
// conversation, what any replica holds is someone else's (a shared system
// prompt) and buys nothing. Requests without a session key need an excess
// of half the prompt.
func (p *KV) affinity(d *Decision, req *Request, cands []Candidate, prompt float64) int {
	slack := p.cfg.AffinitySlack.Seconds()
	if slack <= 0 || len(cands) < 2 {
		return -1
	}
	minCost, inFlight := math.Inf(1), 0.0
	best, others := -1, 0.0 // the largest overlap; the largest among the rest
	for i, t := range d.Terms {
		minCost = math.Min(minCost, t.Cost)
		inFlight += float64(cands[i].Load.InFlight)
		switch {
		case best < 0 || t.Overlap > d.Terms[best].Overlap:
			if best >= 0 {
				others = d.Terms[best].Overlap
			}
			best = i
		default:
			others = math.Max(others, t.Overlap)
		}
	}
	if home := p.sessions.replica(req.SessionKey); home != "" {
		return p.home(d, cands, home, minCost, slack)
	}
	t := d.Terms[best]
	gain := (t.Overlap - others) * float64(p.blockSize)
	if p.sessions != nil && req.SessionKey != "" {
		return -1 // a new conversation: what any replica holds is shared
	}
	if gain <= 0 || gain < 0.5*prompt || t.Cost > minCost+slack {
		return -1
	}
	// The others' mean, not all candidates': with two replicas the
	// holder's own load would lift the cap past anything it can carry.
	held := float64(cands[best].Load.InFlight)
	if lc := p.cfg.AffinityLoadCap; lc > 0 && held > lc*(inFlight-held)/float64(len(cands)-1)+1 {
		return -1
	}
	return best
}

// home returns the index of the remembered conversation's replica home when
// the affinity keeps it there, else -1: home must hold more of the prompt
// than every other candidate (what it holds beyond the others is the
// conversation's own history) and cost at most slack more than the
// cheapest, or more when every cheaper candidate would have to evict to
// take it (noRoom). A home that holds some of the prompt but no more than
// another candidate (its cache has kept only a prefix others hold too,
// such as a shared system prompt) has none of the conversation's history
// left to save: wherever the turn goes it writes the same blocks, and the
// cost decides. Keeping it there anyway queued it behind home's load, past
// the slack whenever every cache was full, for no hit. When no candidate
// holds any of the prompt, home is kept within KVConfig.EmptyHomeSlack of
// the cheapest while every cheaper candidate would evict to take it
// (noRoom; docs/results/2026-12-06-routing-sweep-3.md).
func (p *KV) home(d *Decision, cands []Candidate, home string, minCost, slack float64) int {
	h := -1
	for i := range cands {
		if cands[i].Name == home {
			h = i
		}
	}
	if h < 0 {
		return -1
	}
	t := d.Terms[h]
	own, held := t.Overlap > 0, t.Overlap > 0
	for i, o := range d.Terms {
		if i != h && o.Overlap >= t.Overlap {
			own = false // no history of its own at home
		}
		held = held || o.Overlap > 0
	}
	if !own {
		if w := p.cfg.EmptyHomeSlack.Seconds(); held || w < 0 || t.Cost > minCost+w || !noRoom(d, t.Cost) {
			return -1
		}
		return h // no candidate holds any of it, none cheaper has room: stay put
	}
	if t.Cost > minCost+slack && !noRoom(d, t.Cost) {
		return -1
	}
	return h
}

// noRoom reports whether every candidate cheaper than cost would evict to
// take the request (Terms.Evict > 0): then moving a conversation copies its
// history over other conversations' cached blocks, each of which costs a
// recompute that in turn evicts, so under cache pressure the slack does not
// bound its stickiness: the conversation stays however long the queue,
// as under session affinity.
func noRoom(d *Decision, cost float64) bool {
	for _, t := range d.Terms {
		if t.Cost < cost && t.Evict <= 0 {
			return false
		}
	}
	return true
}

// rate guards a throughput used as a divisor.
func rate(r float64) float64 {
	if r <= 0 {
		return 1
	}
	return r
}

func pos(w float64) float64 { return math.Max(0, w) }
