package routing

import "sync/atomic"

// RoundRobin cycles through the candidates in the order given (the Router
// gives them in a stable order); a shared counter advances once per Pick.
type RoundRobin struct{ next atomic.Uint64 }

var _ Policy = (*RoundRobin)(nil)

// Pick implements Policy. Every candidate's Cost is 0.
func (p *RoundRobin) Pick(_ *Request, cands []Candidate) Decision {
	d := newDecision("round_robin", cands)
	n := p.next.Add(1) - 1
	return d.choose(int(n%uint64(len(cands))), cands, "round_robin")
}

// Evaluate implements Evaluator: the candidate the next Pick would choose
// (absent other Picks in between), without advancing the counter.
func (p *RoundRobin) Evaluate(_ *Request, cands []Candidate) Decision {
	d := newDecision("round_robin", cands)
	return d.choose(int(p.next.Load()%uint64(len(cands))), cands, "round_robin")
}
