package enginesim

// DecodeAlone runs the decode steps of the Core's only sequence at once,
// up to but not including its last token, exactly as that many calls of
// Step would run them (the same blocks allocated and cached in the same
// order, the same tokens, busy time and Stats, KV events left queued for the
// next Step), without building their Outputs. It does nothing unless one
// sequence is running, none is waiting, and the running one has produced
// its first token and computed every token it has; it stops early where
// Step would preempt (too few free blocks), leaving that to Step. It returns
// the tokens it generated. The pooled-cache bound (sim.PooledBound) serves
// one request at a time and needs only its cache, so it spends its decode
// here instead of one Step per token.
func (c *Core) DecodeAlone() int {
	if len(c.running) != 1 || c.waiting.len() > 0 {
		return 0
	}
	s := c.running[0]
	if s.generated() == 0 || s.computed != s.numTokens()-1 {
		return 0
	}
	d := c.cfg.Timing.stepDuration(0, 1, 0)
	n := 0
	for s.generated() < s.maxTokens-1 && c.allocate(s, 1) {
		c.busy += d
		c.stats.Steps++
		s.computed++
		s.tokens = append(s.tokens, c.nextToken(s, s.generated()))
		c.stats.GenerationTokens++
		n++
	}
	return n
}
