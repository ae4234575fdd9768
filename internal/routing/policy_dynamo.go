package routing

import "math"

// Dynamo reimplements NVIDIA Dynamo's KV router cost with its defaults
// (ai-dynamo/dynamo lib/llm/src/kv_router/scheduler.rs, later
// lib/kv-router/src/scheduling/selector.rs; docs/router/kv_cache_routing.md):
//
//	prefill_blocks = (active_prefill_tokens + isl - overlap*block_size) / block_size
//	decode_blocks  = active_blocks + new_blocks
//	logit          = overlap_score_weight * prefill_blocks + decode_blocks
//
// with overlap_score_weight 1 (--kv-overlap-score-weight) and temperature 0
// (pick the minimum). Its overlap is device blocks with full credit however
// busy the worker (no decay). Mapping: active_prefill_tokens =
// Load.QueuedPrefill, active_blocks = Load.ActiveTokens/block_size, overlap =
// Match.GPU + Match.Predicted (Dynamo counts only device blocks; its
// approximate mode counts routed ones), new_blocks = ceil(isl/block_size) -
// overlap. Ties go to the lower load, then at random.
type Dynamo struct {
	cfg       DynamoConfig
	blockSize int
	rng       *lockedRand
}

var _ Policy = (*Dynamo)(nil)

// Pick implements Policy. Cost is Dynamo's logit, in blocks.
func (p *Dynamo) Pick(req *Request, cands []Candidate) Decision { return p.decide(req, cands, p.rng) }

// Evaluate implements Evaluator: Pick with ties broken without randomness.
func (p *Dynamo) Evaluate(req *Request, cands []Candidate) Decision {
	return p.decide(req, cands, nil)
}

func (p *Dynamo) decide(req *Request, cands []Candidate, rng *lockedRand) Decision {
	d := newDecision("dynamo", cands)
	bs := float64(max(p.blockSize, 1))
	isl := float64(req.promptTokens())
	reqBlocks := math.Ceil(isl / bs)
	for i := range cands {
		m, l, t := &cands[i].Match, &cands[i].Load, &d.Terms[i]
		overlap := float64(m.GPU + m.Predicted)
		t.Overlap = overlap
		t.Credit = math.Min(isl, overlap*bs)
		t.NewTokens = isl - t.Credit
		prefill := (float64(l.QueuedPrefill) + t.NewTokens) / bs
		decode := float64(l.ActiveTokens)/bs + math.Max(0, reqBlocks-overlap)
		t.Cost = p.cfg.OverlapWeight*prefill + decode
	}
	return pickMin(&d, cands, rng)
}
