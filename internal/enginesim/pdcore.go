package enginesim

// Disaggregated prefill and decode in the core, after vLLM's
// NixlConnector (vllm/distributed/kv_transfer/kv_connector/v1/nixl/
// scheduler.py at vllm-project/vllm c8fac58) and the V1 scheduler's
// WAITING_FOR_REMOTE_KVS state:
//
//   - A decode-side request (Request.RemoteKV, the API's
//     kv_transfer_params.do_remote_prefill) is admitted like any other: its
//     locally cached prefix is reused, and blocks are allocated for the
//     rest of the prompt's full blocks, which the connector pulls
//     (get_num_new_matched_tokens counts the prompt tokens not computed
//     locally). It then waits, holding the blocks, in no batch and costing
//     no step time, while the owner charges the transfer (StepResult
//     Transfers). Received ends the wait: the pulled blocks are cached (one
//     BlockStored, as the scheduler caches received blocks) and the request
//     runs, computing only the prompt's last partial block (at least its
//     last token) before its first output token.
//   - A prefill-side request (Request.RemoteDecode) runs normally (the
//     proxy sends it with max_tokens 1); its last Output carries its block
//     ids, the source of kv_transfer_params.remote_block_ids. The blocks are
//     freed at once (they stay cached until evicted); vLLM holds them for
//     the decode engine's read under a lease (kv_lease_duration, 30 s),
//     which the simulator does not model.

// statusReceiving marks a RemoteKV request waiting for its KV transfer.
const statusReceiving seqStatus = 2

// Transfer is one KV pull a RemoteKV request waits for.
type Transfer struct {
	// ID is the request's ID.
	ID string
	// Tokens is how many prompt tokens' KV is pulled (whole blocks: the
	// prompt's full blocks beyond the local prefix-cache hit, at most
	// prompt-1 tokens); 0 when the engine held them all.
	Tokens int
}

// admitRemote admits a RemoteKV request whose local hit is hits: it
// allocates the blocks to pull and parks the request until Received. It
// reports false, changing nothing, when too few blocks are free.
func (c *Core) admitRemote(s *seq, hits []int32, res *StepResult) bool {
	bs := c.cfg.BlockSize
	maxBlocks := (s.numTokens() - 1) / bs
	pull := max(maxBlocks-len(hits), 0)
	evictable := 0
	for _, id := range hits {
		if c.pool.blocks[id].ref == 0 {
			evictable++
		}
	}
	if pull+evictable > c.pool.numFree {
		return false
	}
	c.waiting.popFront()
	if s.cachedTokens < 0 {
		s.cachedTokens = len(hits) * bs
		c.stats.PromptTokens += int64(s.promptLen)
	}
	c.stats.PrefixQueries += int64(s.numTokens())
	c.stats.PrefixHits += int64(len(hits) * bs)
	c.takeHits(s, hits)
	if pull > 1 {
		c.pool.warmFree(pull)
	}
	for range pull {
		s.blocks = append(s.blocks, c.pool.alloc())
	}
	s.computed = len(hits) * bs
	s.status = statusReceiving
	c.receiving++
	res.Transfers = append(res.Transfers, Transfer{ID: s.id, Tokens: pull * bs})
	return true
}

// Received ends the KV transfer of request id: its pulled blocks are
// computed and cached (a BlockStored in the next Step's events) and it
// joins the running sequences. It reports false for an unknown id or one
// not waiting for a transfer (aborted, restarted).
func (c *Core) Received(id string) bool {
	s, ok := c.byID[id]
	if !ok || s.status != statusReceiving {
		return false
	}
	c.receiving--
	s.remote = false // a preemption later recomputes locally
	n := len(s.blocks) * c.cfg.BlockSize
	c.stats.RemoteTokens += int64(n - s.computed)
	s.computed = n
	c.cacheFull(s, n)
	s.status = statusRunning
	c.running = append(c.running, s)
	return true
}

// Receiving is the number of requests waiting for their KV transfer; they
// hold blocks but are neither Waiting nor Running, and Idle ignores them.
func (c *Core) Receiving() int { return c.receiving }
