package routing

import "github.com/zeebo/xxh3"

// Session pins a conversation to a replica by rendezvous (highest random
// weight) hashing of Request.SessionKey with each candidate's name: every
// router replica computes the same choice without shared state, concurrent
// first requests of a session agree, and when the pinned replica leaves only
// its sessions move (to their next-highest replica). Requests without a
// session key go to Fallback (Config.SessionFallback, default kv).
type Session struct{ Fallback Policy }

var _ Policy = (*Session)(nil)

// Pick implements Policy. Cost is the negated rendezvous weight scaled to
// [-1, 0].
func (p *Session) Pick(req *Request, cands []Candidate) Decision { return p.decide(req, cands, false) }

// Evaluate implements Evaluator: the rendezvous choice, or the fallback's
// evaluation (see EvaluatePolicy) for requests without a session key.
func (p *Session) Evaluate(req *Request, cands []Candidate) Decision {
	return p.decide(req, cands, true)
}

func (p *Session) decide(req *Request, cands []Candidate, dry bool) Decision {
	if req.SessionKey == "" {
		var d Decision
		if dry {
			d = EvaluatePolicy(p.Fallback, req, cands)
		} else {
			d = p.Fallback.Pick(req, cands)
		}
		d.Reason = "no_session/" + d.Reason
		return d
	}
	d := newDecision("session", cands)
	best, bestW := 0, uint64(0)
	seed := xxh3.HashString(req.SessionKey)
	for i := range cands {
		w := xxh3.HashStringSeed(cands[i].Name, seed)
		d.Terms[i].Cost = -float64(w>>11) / (1 << 53)
		if i == 0 || w > bestW {
			best, bestW = i, w
		}
	}
	return d.choose(best, cands, "session")
}
