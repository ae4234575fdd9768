package enginesim

import (
	"errors"
	"reflect"
	"slices"
	"testing"

	"kvrouter/internal/vllm"
)

// stepCopy is a StepResult whose slices are copied (Step reuses them).
type stepCopy struct {
	res     StepResult
	outputs []Output
	events  []vllm.Event
}

func step(c *Core) stepCopy {
	r := c.Step()
	return stepCopy{res: r, outputs: slices.Clone(r.Outputs), events: slices.Clone(r.Events)}
}

// drain steps until idle (bounded) and returns every step.
func drain(t *testing.T, c *Core) []stepCopy {
	t.Helper()
	var out []stepCopy
	for i := 0; !c.Idle(); i++ {
		if i > 10000 {
			t.Fatal("core did not drain in 10000 steps")
		}
		out = append(out, step(c))
	}
	return out
}

func seqTokens(from, n int) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = uint32(from + i)
	}
	return t
}

func newTestCore(t *testing.T, cfg CoreConfig) *Core {
	t.Helper()
	if cfg.Profile == "" {
		cfg.Profile = ProfileFast
	}
	c, err := NewCore(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func mustSubmit(t *testing.T, c *Core, r *Request) {
	t.Helper()
	if err := c.Submit(r); err != nil {
		t.Fatal(err)
	}
}

// chain computes the expected hashes of tokens' full blocks with the
// core's hasher algorithm, independently of the core.
func chain(h BlockHasher, bs int, toks []uint32, lora, salt string) []vllm.BlockHash {
	var out []vllm.BlockHash
	var parent []byte
	for i := 0; (i+1)*bs <= len(toks); i++ {
		d := h.HashBlock(parent, toks[i*bs:(i+1)*bs], blockExtraKeys(lora, salt, i))
		parent = slices.Clone(d)
		out = append(out, vllm.EventValue(d))
	}
	return out
}

func ptr[T any](v T) *T { return &v }

func stored(hashes []vllm.BlockHash, parent *vllm.BlockHash, toks []uint32, bs int, medium string) vllm.Event {
	return vllm.Event{
		Type: vllm.BlockStored, BlockHashes: hashes, ParentBlockHash: parent, TokenIDs: toks,
		BlockSize: bs, Medium: medium, ExtraKeys: make([][]any, len(hashes)),
		GroupIdx: ptr(0), KVCacheSpecKind: vllm.FullAttention,
	}
}

func removed(h vllm.BlockHash, medium string) vllm.Event {
	return vllm.Event{Type: vllm.BlockRemoved, BlockHashes: []vllm.BlockHash{h}, Medium: medium, GroupIdx: ptr(0)}
}

func checkEvents(t *testing.T, what string, got, want []vllm.Event) {
	t.Helper()
	if len(got) == 0 && len(want) == 0 {
		return
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%s events:\n got %+v\nwant %+v", what, got, want)
	}
}

// TestPrefixHitScript: a request fills blocks during prefill and decode; the
// same prompt again hits n-1 tokens rounded down to whole blocks.
func TestPrefixHitScript(t *testing.T) {
	const bs = 4
	c := newTestCore(t, CoreConfig{BlockSize: bs, NumGPUBlocks: 9, MaxModelLen: 32, MaxNumBatchedTokens: 64})
	h := NewFastHasher("")
	prompt := seqTokens(1, 10)
	mustSubmit(t, c, &Request{ID: "a", Tokens: prompt, MaxTokens: 3})

	s1 := step(c) // prefill 10 tokens, 2 full blocks stored, first token
	hs := chain(h, bs, prompt, "", "")
	checkEvents(t, "step 1", s1.events, []vllm.Event{stored(hs, nil, prompt[:8], bs, "GPU")})
	if s1.res.PrefillTokens != 10 || len(s1.outputs) != 1 || s1.outputs[0].Index != 0 || s1.outputs[0].CachedTokens != 0 {
		t.Fatalf("step 1: %+v %+v", s1.res, s1.outputs)
	}
	s2 := step(c) // computes token 11: no block fills
	checkEvents(t, "step 2", s2.events, nil)
	if s2.res.DecodeSeqs != 1 || s2.res.PrefillTokens != 0 {
		t.Fatalf("step 2: %+v", s2.res)
	}
	s3 := step(c) // computes token 12: block 2 (prompt 9,10 + outputs 0,1) is full
	full := append(slices.Clone(prompt), s1.outputs[0].Token, s2.outputs[0].Token)
	hs3 := chain(h, bs, full, "", "")
	checkEvents(t, "step 3", s3.events, []vllm.Event{stored(hs3[2:], ptr(hs3[1]), full[8:12], bs, "GPU")})
	if !s3.outputs[0].Finished || s3.outputs[0].FinishReason != "length" || !c.Idle() {
		t.Fatalf("step 3: %+v idle=%v", s3.outputs, c.Idle())
	}
	if c.CachedBlocks() != 3 || c.KVUsage() != 0 {
		t.Fatalf("after a: cached %d usage %v", c.CachedBlocks(), c.KVUsage())
	}

	mustSubmit(t, c, &Request{ID: "b", Tokens: prompt, MaxTokens: 1})
	sb := step(c)
	if sb.res.PrefillTokens != 2 || sb.outputs[0].CachedTokens != 8 {
		t.Fatalf("b: prefill %d cached %d, want 2 and 8", sb.res.PrefillTokens, sb.outputs[0].CachedTokens)
	}
	checkEvents(t, "b", sb.events, nil) // reused blocks emit nothing by default
	if sb.outputs[0].Token != s1.outputs[0].Token {
		t.Error("equal prompts must give equal outputs")
	}
	st := c.Stats()
	if st.PrefixQueries != 20 || st.PrefixHits != 8 || st.Finished != 2 || st.GenerationTokens != 4 {
		t.Fatalf("stats %+v", st)
	}
}

// TestHitReportFull: kv_cache_report_mode "full" re-reports reused blocks
// with a nil parent from block 0, before the new blocks.
func TestHitReportFull(t *testing.T) {
	const bs = 4
	c := newTestCore(t, CoreConfig{BlockSize: bs, NumGPUBlocks: 17, MaxModelLen: 64})
	h := NewFastHasher("")
	base := seqTokens(100, 8)
	mustSubmit(t, c, &Request{ID: "a", Tokens: append(slices.Clone(base), 1), MaxTokens: 1, LoRAName: "ad", CacheSalt: "s"})
	drain(t, c)
	long := append(slices.Clone(base), seqTokens(500, 9)...)
	mustSubmit(t, c, &Request{ID: "b", Tokens: long, MaxTokens: 1, LoRAName: "ad", CacheSalt: "s", ReportHits: true})
	s := step(c)
	hs := chain(h, bs, long, "ad", "s")
	lora := ptr("ad")
	want := []vllm.Event{stored(hs[:2], nil, long[:8], bs, "GPU"), stored(hs[2:4], ptr(hs[1]), long[8:16], bs, "GPU")}
	for i := range want {
		want[i].LoRAName, want[i].LoRAID = lora, ptr(int64(1))
	}
	want[0].ExtraKeys = [][]any{{"ad", "s"}, {"ad"}}
	want[1].ExtraKeys = [][]any{{"ad"}, {"ad"}}
	checkEvents(t, "report", s.events, want)
	if s.outputs[0].CachedTokens != 8 {
		t.Errorf("cached %d, want 8", s.outputs[0].CachedTokens)
	}
}

// TestEvictionLRU: freed blocks keep their hash; the blocks of a request's
// tail are evicted first, only when unreferenced, each with a BlockRemoved.
func TestEvictionLRU(t *testing.T) {
	const bs = 4
	c := newTestCore(t, CoreConfig{BlockSize: bs, NumGPUBlocks: 9, MaxModelLen: 32})
	h := NewFastHasher("")
	a := seqTokens(1, 12)
	mustSubmit(t, c, &Request{ID: "a", Tokens: a, MaxTokens: 1})
	drain(t, c) // blocks 1,2,3 hold a's 3 full blocks, freed tail first
	ha := chain(h, bs, a, "", "")

	// b needs 5 blocks for its prompt: the 5 never-used blocks, no eviction.
	b := seqTokens(1000, 20)
	mustSubmit(t, c, &Request{ID: "b", Tokens: b, MaxTokens: 2})
	s1 := step(c)
	hb := chain(h, bs, b, "", "")
	checkEvents(t, "b prefill", s1.events, []vllm.Event{stored(hb, nil, b, bs, "GPU")})
	// b's second output needs a 6th block: a's last block goes first.
	s2 := step(c)
	checkEvents(t, "b decode", s2.events, []vllm.Event{removed(ha[2], "GPU")})
	drain(t, c)
	// a's first two blocks are still cached: a hits 8 tokens.
	mustSubmit(t, c, &Request{ID: "a2", Tokens: a, MaxTokens: 1})
	s3 := step(c)
	if got := s3.outputs[0].CachedTokens; got != 8 {
		t.Errorf("a2 cached %d, want 8", got)
	}
}

// TestPreemption: when blocks run out, the last running sequence is
// preempted by recompute, goes back to the front of the waiting queue, and
// still produces exactly the same tokens.
func TestPreemption(t *testing.T) {
	const bs = 4
	c := newTestCore(t, CoreConfig{BlockSize: bs, NumGPUBlocks: 5, MaxModelLen: 16})
	ref := newTestCore(t, CoreConfig{BlockSize: bs, NumGPUBlocks: 64, MaxModelLen: 16})
	for _, core := range []*Core{c, ref} {
		mustSubmit(t, core, &Request{ID: "a", Tokens: seqTokens(1, 6), MaxTokens: 8})
		mustSubmit(t, core, &Request{ID: "b", Tokens: seqTokens(50, 6), MaxTokens: 8})
	}
	outs := func(steps []stepCopy) map[string][]uint32 {
		m := map[string][]uint32{}
		for _, s := range steps {
			for _, o := range s.outputs {
				if o.Index != len(m[o.ID]) {
					t.Fatalf("%s: output index %d after %d tokens", o.ID, o.Index, len(m[o.ID]))
				}
				m[o.ID] = append(m[o.ID], o.Token)
			}
		}
		return m
	}
	steps := drain(t, c)
	preemptAt := -1
	for i, s := range steps {
		if s.res.Preempted > 0 && preemptAt < 0 {
			preemptAt = i
		}
	}
	// Steps 0..2 fit in 4 blocks; step 3 computes token 9 of a: 3rd block.
	if preemptAt != 3 {
		t.Fatalf("first preemption at step %d, want 3", preemptAt)
	}
	if st := c.Stats(); st.Preemptions < 1 || st.Finished != 2 {
		t.Fatalf("stats %+v", st)
	}
	got, want := outs(steps), outs(drain(t, ref))
	if !reflect.DeepEqual(got, want) || len(got["a"]) != 8 || len(got["b"]) != 8 {
		t.Fatalf("outputs with preemption %v, without %v", got, want)
	}
	if ref.Stats().Preemptions != 0 {
		t.Fatal("reference core preempted")
	}
}

// TestChunkedPrefillAndMaxSeqs: the token budget chunks a long prompt and
// max_num_seqs caps running sequences.
func TestChunkedPrefillAndMaxSeqs(t *testing.T) {
	c := newTestCore(t, CoreConfig{BlockSize: 16, NumGPUBlocks: 200, MaxModelLen: 1024, MaxNumBatchedTokens: 100, MaxNumSeqs: 2})
	mustSubmit(t, c, &Request{ID: "long", Tokens: seqTokens(1, 250), MaxTokens: 1})
	mustSubmit(t, c, &Request{ID: "x", Tokens: seqTokens(1000, 10), MaxTokens: 5})
	mustSubmit(t, c, &Request{ID: "y", Tokens: seqTokens(2000, 10), MaxTokens: 5})
	var prefills []int
	for _, s := range drain(t, c) {
		prefills = append(prefills, s.res.PrefillTokens)
		if s.res.Scheduled > 2 {
			t.Fatalf("scheduled %d > max_num_seqs", s.res.Scheduled)
		}
	}
	// step 0: long 100; step 1: long 100; step 2: long 50 + x 10 (budget 100);
	// then x decodes and y is admitted once long finished.
	if want := []int{100, 100, 60, 10, 0, 0, 0, 0}; !slices.Equal(prefills, want) {
		t.Fatalf("prefill tokens per step %v, want %v", prefills, want)
	}
}

// TestSameStepSharing: blocks are cached when scheduled (vLLM caches in
// allocate_slots, before the forward pass), so a second identical prompt
// admitted in the same step already hits them.
func TestSameStepSharing(t *testing.T) {
	const bs = 4
	c := newTestCore(t, CoreConfig{BlockSize: bs, NumGPUBlocks: 9, MaxModelLen: 16})
	p := seqTokens(7, 9)
	mustSubmit(t, c, &Request{ID: "a", Tokens: p, MaxTokens: 1})
	mustSubmit(t, c, &Request{ID: "b", Tokens: p, MaxTokens: 1})
	s := step(c)
	h := chain(NewFastHasher(""), bs, p, "", "")
	checkEvents(t, "same step", s.events, []vllm.Event{stored(h, nil, p[:8], bs, "GPU")})
	if s.res.PrefillTokens != 9+1 || s.outputs[1].CachedTokens != 8 {
		t.Fatalf("%+v %+v", s.res, s.outputs)
	}
}

// TestDuplicateCopies: several physical blocks may hold one hash (vLLM keeps
// them all); each copy's eviction is reported and the others stay cached.
func TestDuplicateCopies(t *testing.T) {
	var evicted []int32
	p := newBlockPool(4, false)
	p.onEvict = func(id int32, _ *gpuBlock, _ *blockMeta) { evicted = append(evicted, id) }
	ids := []int32{p.alloc(), p.alloc(), p.alloc()}
	for _, id := range ids {
		p.cache(id, 42, blockMeta{})
	}
	p.free(ids)
	for range 2 {
		p.alloc()
	}
	if !slices.Equal(evicted, ids[:2]) {
		t.Fatalf("evicted %v, want %v", evicted, ids[:2])
	}
	if got := p.lookup(42); got != ids[2] {
		t.Fatalf("remaining copy %d, want %d", got, ids[2])
	}
	p.alloc()
	if p.lookup(42) != nilBlock || p.numHashed() != 0 {
		t.Fatal("all copies evicted but hash still cached")
	}
}

// TestCPUTier: evicted blocks are offloaded (events with medium CPU) and a
// later hit reloads them at the transfer cost instead of recomputing.
func TestCPUTier(t *testing.T) {
	const bs = 4
	c := newTestCore(t, CoreConfig{BlockSize: bs, NumGPUBlocks: 5, NumCPUBlocks: 2, MaxModelLen: 16})
	h := NewFastHasher("")
	a := seqTokens(1, 9) // 2 full blocks
	mustSubmit(t, c, &Request{ID: "a", Tokens: a, MaxTokens: 1})
	drain(t, c)
	ha := chain(h, bs, a, "", "")
	mustSubmit(t, c, &Request{ID: "b", Tokens: seqTokens(100, 15), MaxTokens: 1})
	s := step(c)
	// b takes the never-used block, a's partial block, then a's tail block,
	// then a's head block (a's blocks were freed tail first).
	want := []vllm.Event{
		removed(ha[1], "GPU"), stored(ha[1:2], ptr(ha[0]), a[4:8], bs, "CPU"),
		removed(ha[0], "GPU"), stored(ha[:1], nil, a[:4], bs, "CPU"),
	}
	hb := chain(h, bs, seqTokens(100, 15), "", "")
	want = append(want, stored(hb, nil, seqTokens(100, 12), bs, "GPU"))
	checkEvents(t, "offload", s.events, want)
	drain(t, c)
	mustSubmit(t, c, &Request{ID: "a2", Tokens: a, MaxTokens: 1})
	s = step(c)
	if s.res.LoadedTokens != 8 || s.res.PrefillTokens != 1 || s.outputs[0].CachedTokens != 8 {
		t.Fatalf("reload: %+v cached %d", s.res, s.outputs[0].CachedTokens)
	}
	tm := c.Config().Timing
	if want := tm.stepDuration(1, 0, 8); s.res.Duration != want {
		t.Fatalf("duration %v, want %v", s.res.Duration, want)
	}
	if st := c.Stats(); st.ExternalHits != 8 || st.PrefixHits != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestAbortAndReset(t *testing.T) {
	c := newTestCore(t, CoreConfig{BlockSize: 4, NumGPUBlocks: 9, MaxModelLen: 32})
	mustSubmit(t, c, &Request{ID: "a", Tokens: seqTokens(1, 9), MaxTokens: 5})
	mustSubmit(t, c, &Request{ID: "w", Tokens: seqTokens(1, 9), MaxTokens: 5})
	step(c)
	if c.ResetPrefixCache() {
		t.Fatal("reset must fail while blocks are held")
	}
	if !c.Abort("a") || !c.Abort("w") || c.Abort("a") {
		t.Fatal("abort")
	}
	if !c.Idle() || c.KVUsage() != 0 || c.Stats().Aborted != 2 {
		t.Fatalf("after abort: idle %v usage %v", c.Idle(), c.KVUsage())
	}
	if !c.ResetPrefixCache() || c.CachedBlocks() != 0 {
		t.Fatal("reset")
	}
	s := step(c)
	checkEvents(t, "reset", s.events, []vllm.Event{{Type: vllm.AllBlocksCleared}})
	mustSubmit(t, c, &Request{ID: "a", Tokens: seqTokens(1, 9), MaxTokens: 1})
	if s := step(c); s.outputs[0].CachedTokens != 0 {
		t.Fatal("hit after reset")
	}
}

func TestSubmitErrors(t *testing.T) {
	c := newTestCore(t, CoreConfig{BlockSize: 4, NumGPUBlocks: 9, MaxModelLen: 32})
	mustSubmit(t, c, &Request{ID: "a", Tokens: seqTokens(1, 3), MaxTokens: 1})
	for _, tc := range []struct {
		name string
		r    Request
		want error
	}{
		{"empty", Request{ID: "e", MaxTokens: 1}, ErrInvalidRequest},
		{"no output", Request{ID: "e", Tokens: []uint32{1}}, ErrInvalidRequest},
		{"too long", Request{ID: "e", Tokens: seqTokens(0, 30), MaxTokens: 3}, ErrInvalidRequest},
		{"duplicate", Request{ID: "a", Tokens: []uint32{1}, MaxTokens: 1}, ErrDuplicateID},
	} {
		if err := c.Submit(&tc.r); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
}

func TestConfigErrors(t *testing.T) {
	_, err := NewCore(CoreConfig{BlockSize: -1, NumGPUBlocks: 1, MaxModelLen: 10, Profile: "nope"})
	if err == nil {
		t.Fatal("want error")
	}
	_, err = NewCore(CoreConfig{BlockSize: 16, NumGPUBlocks: 10, MaxModelLen: 1000})
	if err == nil {
		t.Fatal("max_model_len beyond the cache must fail, as in vLLM")
	}
}

// TestCachedPrefix: PrefixHashes are the chained hashes a request's
// BlockStored carries, and CachedPrefix counts the leading ones the GPU
// cache holds, from the moment the step caching them is scheduled until
// they are evicted.
func TestCachedPrefix(t *testing.T) {
	const bs = 4
	c := newTestCore(t, CoreConfig{BlockSize: bs, NumGPUBlocks: 6, MaxModelLen: 20})
	p := seqTokens(1, 11) // 2 full blocks + 3 tokens
	hs := c.PrefixHashes(nil, p)
	if want := chain(NewFastHasher(""), bs, p, "", ""); !slices.Equal(hs, want[:2]) {
		t.Fatalf("PrefixHashes %v, want %v", hs, want[:2])
	}
	if n := c.CachedPrefix(hs); n != 0 {
		t.Fatalf("cold cache: %d", n)
	}
	mustSubmit(t, c, &Request{ID: "a", Tokens: p, MaxTokens: 1})
	c.Step() // the step under way has cached both full blocks
	if n := c.CachedPrefix(hs); n != 2 {
		t.Fatalf("after scheduling: %d, want 2", n)
	}
	drain(t, c)
	other := c.PrefixHashes(nil, seqTokens(100, 19)) // 5 blocks with its output: evicts all of a's
	mustSubmit(t, c, &Request{ID: "b", Tokens: seqTokens(100, 19), MaxTokens: 1})
	drain(t, c)
	if n := c.CachedPrefix(hs); n != 0 {
		t.Fatalf("after eviction: %d, want 0", n)
	}
	if n := c.CachedPrefix(other); n != 4 {
		t.Fatalf("b's prefix: %d, want 4", n)
	}
}
