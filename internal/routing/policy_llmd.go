package routing

// LLMD reimplements llm-d's default scheduling profile (llm-d
// inference-scheduler guides, "optimized baseline" / inference-scheduling
// EndpointPickerConfig): the weighted sum of three scorers, each in [0, 1],
// and the max-score picker:
//
//	queue-scorer (weight 2):                 (max_q - q)/(max_q - min_q), 1 when all equal
//	kv-cache-utilization-scorer (weight 2):  1 - kv_usage
//	prefix-cache-scorer (weight 3):          matched blocks / request blocks
//
// q is vllm:num_requests_waiting when the gauges are fresh, else this router's
// in-flight requests; kv_usage is vllm:kv_cache_usage_perc (0 when stale).
// The prefix match uses this router's index (llm-d's precise mode uses KV
// events too), counting every tier. Ties go to the lower load, then at random.
type LLMD struct {
	cfg       LLMDConfig
	blockSize int
	rng       *lockedRand
}

var _ Policy = (*LLMD)(nil)

// Pick implements Policy. Cost is the negated weighted score (-7..0 with the
// default weights).
func (p *LLMD) Pick(req *Request, cands []Candidate) Decision { return p.decide(req, cands, p.rng) }

// Evaluate implements Evaluator: Pick with ties broken without randomness.
func (p *LLMD) Evaluate(req *Request, cands []Candidate) Decision { return p.decide(req, cands, nil) }

func (p *LLMD) decide(req *Request, cands []Candidate, rng *lockedRand) Decision {
	d := newDecision("llmd", cands)
	queue := func(c *Candidate) float64 {
		if c.Load.Fresh {
			return float64(c.Load.Waiting)
		}
		return float64(c.Load.InFlight)
	}
	minQ, maxQ := queue(&cands[0]), queue(&cands[0])
	for i := range cands {
		q := queue(&cands[i])
		minQ, maxQ = min(minQ, q), max(maxQ, q)
	}
	reqBlocks := req.promptTokens() / max(p.blockSize, 1)
	for i := range cands {
		c, t := &cands[i], &d.Terms[i]
		qs := 1.0
		if maxQ > minQ {
			qs = (maxQ - queue(c)) / (maxQ - minQ)
		}
		ps := 0.0
		if reqBlocks > 0 {
			ps = min(1, float64(c.Match.Blocks())/float64(reqBlocks))
		}
		kv := 1 - min(1, max(0, c.Load.KVUsage))
		t.Cost = -(p.cfg.QueueWeight*qs + p.cfg.KVUsageWeight*kv + p.cfg.PrefixWeight*ps)
	}
	return pickMin(&d, cands, rng)
}
