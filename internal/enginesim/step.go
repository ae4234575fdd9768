package enginesim

import (
	"slices"

	"kvrouter/internal/vllm"
)

// Step runs one engine step and returns what it did; the step's outputs and
// events take effect Duration after it starts (the owner waits Duration
// before delivering them and calling Step again). Step on an idle Core returns a zero StepResult (except
// for events queued since the last Step).
//
// Scheduling follows vLLM V1's scheduler (vllm/v1/core/sched/scheduler.py):
// running sequences first, in order, each taking min(remaining tokens,
// budget) tokens; when blocks run out the last running sequence is
// preempted by recompute (blocks freed, back to the front of the waiting
// queue) until the allocation fits. Then, if nobody was preempted, waiting
// sequences are admitted in FCFS order while the token budget and
// MaxNumSeqs allow, each with a prefix-cache lookup. A sequence whose known
// tokens are all computed samples one token.
func (c *Core) Step() StepResult {
	c.outs = c.outs[:0]
	c.scheduled = c.scheduled[:0]
	var res StepResult
	budget := c.cfg.MaxNumBatchedTokens

	for i := 0; i < len(c.running) && budget > 0; {
		s := c.running[i]
		n := min(s.numTokens()-s.computed, budget)
		if n <= 0 {
			i++
			continue
		}
		ok := true
		for !c.allocate(s, n) {
			victim := c.running[len(c.running)-1]
			c.running = c.running[:len(c.running)-1]
			c.preempt(victim)
			res.Preempted++
			if victim == s {
				ok = false
				break
			}
		}
		if !ok {
			break
		}
		decode := n == 1 && s.generated() > 0
		c.scheduled = append(c.scheduled, scheduledSeq{s: s, n: n, decode: decode})
		budget -= n
		i++
	}

	if res.Preempted == 0 {
		for c.waiting.len() > 0 && budget > 0 && len(c.running) < c.cfg.MaxNumSeqs {
			s := c.waiting.front()
			gpuHit, cpuHit := c.lookup(s)
			if s.remote {
				if !c.admitRemote(s, gpuHit, &res) {
					break
				}
				continue
			}
			computed := (len(gpuHit) + cpuHit) * c.cfg.BlockSize
			n := min(s.numTokens()-computed, budget)
			if !c.admit(s, gpuHit, cpuHit, computed, n) {
				break
			}
			c.waiting.popFront()
			s.status = statusRunning
			c.running = append(c.running, s)
			c.scheduled = append(c.scheduled, scheduledSeq{s: s, n: n, decode: n == 1 && s.generated() > 0})
			budget -= n
			res.LoadedTokens += cpuHit * c.cfg.BlockSize
		}
	}

	for _, sc := range c.scheduled {
		if sc.decode {
			res.DecodeSeqs++
		} else {
			res.PrefillTokens += sc.n
		}
	}
	res.Duration = c.cfg.Timing.stepDuration(res.PrefillTokens, res.DecodeSeqs, res.LoadedTokens)
	c.stats.PrefillComputedTokens += int64(res.PrefillTokens)
	c.busy += res.Duration
	finished := false
	for _, sc := range c.scheduled {
		s := sc.s
		s.computed += sc.n
		if s.computed < s.numTokens() {
			continue
		}
		idx := s.generated()
		tok := c.nextToken(s, idx)
		s.tokens = append(s.tokens, tok)
		c.stats.GenerationTokens++
		o := Output{ID: s.id, Token: tok, Index: idx, PromptTokens: s.promptLen, CachedTokens: s.cachedTokens}
		if idx == 0 {
			s.firstTokenAt = c.busy
		}
		if s.generated() >= s.maxTokens {
			o.Finished, o.FinishReason = true, "length"
			o.PrefillTime, o.DecodeTime = s.firstTokenAt-s.scheduledAt, c.busy-s.firstTokenAt
			c.stats.PrefillSeconds += o.PrefillTime.Seconds()
			c.stats.DecodeSeconds += o.DecodeTime.Seconds()
			if s.remoteDecode {
				o.BlockIDs = slices.Clone(s.blocks)
			}
			c.finish(s)
			finished = true
		}
		c.outs = append(c.outs, o)
	}
	if finished {
		kept := c.running[:0]
		for _, s := range c.running {
			if s.status == statusRunning {
				kept = append(kept, s)
			}
		}
		clear(c.running[len(kept):])
		c.running = kept
	}

	res.Scheduled = len(c.scheduled)
	if res.Scheduled > 0 {
		c.stats.Steps++
	}
	res.Outputs = c.outs
	if len(c.pending) > 0 {
		res.Events = c.pending
		c.pending, c.spare = c.spare[:0], c.pending
	}
	return res
}

// statusFinished marks sequences that left the engine during a step.
const statusFinished seqStatus = 255

func (c *Core) finish(s *seq) {
	s.status = statusFinished
	delete(c.byID, s.id)
	c.release(s)
	c.stats.Finished++
}

func (c *Core) preempt(s *seq) {
	c.release(s)
	s.computed = 0
	s.status = statusWaiting
	c.waiting.pushFront(s)
	c.stats.Preemptions++
}

// blocksFor is the number of blocks covering n tokens.
func (c *Core) blocksFor(n int) int { return (n + c.cfg.BlockSize - 1) / c.cfg.BlockSize }

// allocate gives a running sequence the blocks for n more tokens and caches
// the blocks those tokens fill (vLLM allocate_slots). It reports false,
// changing nothing, when too few blocks are free.
func (c *Core) allocate(s *seq, n int) bool {
	extra := c.blocksFor(s.computed+n) - len(s.blocks)
	if extra > c.pool.numFree {
		return false
	}
	if extra > 1 {
		c.pool.warmFree(extra)
	}
	s.blocks = slices.Grow(s.blocks, extra)
	for range extra {
		s.blocks = append(s.blocks, c.pool.alloc())
	}
	c.cacheFull(s, s.computed+n)
	return true
}

// lookup finds s's cached prefix: the GPU blocks holding its leading block
// hashes, then how many following blocks the CPU tier holds. A hit covers at
// most numTokens-1 tokens, in whole blocks (the last token is always
// recomputed). The returned slice is scratch, valid until the next lookup.
func (c *Core) lookup(s *seq) (gpu []int32, cpu int) {
	maxBlocks := (s.numTokens() - 1) / c.cfg.BlockSize
	c.ensureHashes(s, maxBlocks)
	gpu = c.hitBuf()
	i := 0
	for ; i < maxBlocks; i++ {
		id := c.pool.lookup(s.hashes[i])
		if id == nilBlock {
			break
		}
		gpu = append(gpu, id)
	}
	if c.cpu != nil {
		for j := i; j < maxBlocks && c.cpu.has(s.hashes[j]); j++ {
			cpu++
		}
	}
	c.hits = gpu
	return gpu, cpu
}

func (c *Core) hitBuf() []int32 { return c.hits[:0] }

// admit allocates a waiting sequence's blocks: the GPU hits (referenced),
// then new blocks for the CPU hits and the n tokens to compute. It reports
// false, changing nothing, when too few blocks are free.
func (c *Core) admit(s *seq, hits []int32, cpuHit, computed, n int) bool {
	bs := c.cfg.BlockSize
	evictable := 0
	for _, id := range hits {
		if c.pool.blocks[id].ref == 0 {
			evictable++
		}
	}
	newBlocks := c.blocksFor(computed+n) - len(hits)
	if newBlocks+evictable > c.pool.numFree {
		return false
	}
	first := s.cachedTokens < 0
	if first {
		s.cachedTokens = computed
		s.scheduledAt = c.busy
		c.stats.PromptTokens += int64(s.promptLen)
	}
	c.stats.PrefixQueries += int64(s.numTokens())
	c.stats.PrefixHits += int64(len(hits) * bs)
	if c.cpu != nil {
		c.stats.ExternalQueries += int64(s.numTokens() - len(hits)*bs)
		c.stats.ExternalHits += int64(cpuHit * bs)
		for j := len(hits); j < len(hits)+cpuHit; j++ {
			c.cpu.touch(s.hashes[j])
		}
	}
	c.takeHits(s, hits)
	if newBlocks > 1 {
		c.pool.warmFree(newBlocks)
	}
	s.blocks = slices.Grow(s.blocks, newBlocks)
	for range newBlocks {
		s.blocks = append(s.blocks, c.pool.alloc())
	}
	s.computed = computed
	c.cacheFull(s, computed+n)
	return true
}

// ensureHashes computes s's block hashes up to block n (exclusive).
func (c *Core) ensureHashes(s *seq, n int) {
	bs := c.cfg.BlockSize
	for i := len(s.hashes); i < n; i++ {
		var parent []byte
		if i > 0 {
			parent = s.lastHash
		}
		d := c.hasher.HashBlock(parent, s.tokens[i*bs:(i+1)*bs], c.hashKeys(s, i))
		s.lastHash = append(s.lastHash[:0], d...)
		s.hashes = append(s.hashes, vllm.EventValue(d))
		s.foldSeed((i + 1) * bs)
	}
}

func (c *Core) extraKeys(s *seq, block int) []any {
	if len(s.mm) > 0 {
		return mmExtraKeys(s, block, c.cfg.BlockSize, s.mm)
	}
	if block == 0 {
		return blockExtraKeys(derefString(s.lora), s.salt, 0)
	}
	return s.loraKeys
}

func derefString(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// cacheFull registers the blocks of s that the first upTo tokens fill and
// emits one BlockStored for them (vLLM cache_full_blocks).
func (c *Core) cacheFull(s *seq, upTo int) {
	bs := c.cfg.BlockSize
	full := min(upTo, s.numTokens()) / bs
	if full <= s.numCached {
		return
	}
	c.ensureHashes(s, full)
	if full-s.numCached > 1 {
		c.pool.warm(s.hashes[s.numCached:full])
	}
	if c.pool.meta != nil {
		for i := s.numCached; i < full; i++ {
			c.pool.meta[s.blocks[i]] = c.blockMeta(s, i)
			c.pool.cacheHash(s.blocks[i], s.hashes[i])
		}
	} else {
		for i := s.numCached; i < full; i++ {
			c.pool.cacheHash(s.blocks[i], s.hashes[i])
		}
	}
	if !c.cfg.NoEvents {
		c.pending = append(c.pending, c.storedEvent(s, s.numCached, full, vllm.MediumGPU, true))
	}
	s.numCached = full
}

// takeHits makes the cached blocks hits (block ids, in prompt order) s's
// first blocks: touched in the LRU, counted as cached, and, when s asked
// for hit reports (kv_cache_report_mode), reported as stored again.
func (c *Core) takeHits(s *seq, hits []int32) {
	for _, id := range hits {
		c.pool.touch(id)
		s.blocks = append(s.blocks, id)
	}
	s.numCached = len(hits)
	if s.reportHits && len(hits) > 0 && !c.cfg.NoEvents {
		c.pending = append(c.pending, c.storedEvent(s, 0, len(hits), vllm.MediumGPU, false))
	}
}
