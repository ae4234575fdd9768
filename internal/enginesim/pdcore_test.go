package enginesim

import (
	"testing"

	"kvrouter/internal/vllm"
)

// storedBlocks counts the blocks of the BlockStored events in steps.
func storedBlocks(steps []stepCopy) int {
	n := 0
	for _, s := range steps {
		for _, e := range s.events {
			if e.Type == vllm.BlockStored {
				n += len(e.BlockHashes)
			}
		}
	}
	return n
}

// TestCoreRemoteKV: a decode-side request pulls its prompt's full blocks
// beyond the local hit, waits for Received outside every batch, then
// computes only the prompt's last partial block; the pulled blocks are
// published as stored once received.
func TestCoreRemoteKV(t *testing.T) {
	c := newTestCore(t, CoreConfig{})
	prompt := seqTokens(1, 100) // 6 full blocks of 16, 4 tokens more
	mustSubmit(t, c, &Request{ID: "d", Tokens: prompt, MaxTokens: 3, RemoteKV: true})
	s := step(c)
	if len(s.res.Transfers) != 1 || s.res.Transfers[0] != (Transfer{ID: "d", Tokens: 96}) {
		t.Fatalf("transfers %+v, want one of 96 tokens", s.res.Transfers)
	}
	if s.res.Scheduled != 0 || s.res.Duration != 0 || len(s.outputs) != 0 {
		t.Fatalf("a receiving request is in no batch: %+v", s.res)
	}
	if !c.Idle() || c.Receiving() != 1 || c.KVUsage() == 0 {
		t.Fatalf("idle %v receiving %d usage %v: the request holds its blocks while it waits", c.Idle(), c.Receiving(), c.KVUsage())
	}
	if c.Received("nope") {
		t.Fatal("Received of an unknown id")
	}
	if !c.Received("d") || c.Received("d") {
		t.Fatal("Received must succeed exactly once")
	}
	steps := drain(t, c)
	if steps[0].res.PrefillTokens != 4 || len(steps[0].outputs) != 1 || steps[0].outputs[0].Index != 0 {
		t.Fatalf("first step after the transfer: prefill %d outputs %+v, want 4 tokens and the first token", steps[0].res.PrefillTokens, steps[0].outputs)
	}
	if got := storedBlocks(steps); got < 6 {
		t.Fatalf("stored %d blocks, want the 6 received ones published", got)
	}
	if st := c.Stats(); st.RemoteTokens != 96 || st.Finished != 1 {
		t.Fatalf("stats %+v", st)
	}

	// The same prompt again: all 6 blocks are cached locally now, nothing
	// to pull.
	mustSubmit(t, c, &Request{ID: "d2", Tokens: prompt, MaxTokens: 1, RemoteKV: true})
	s = step(c)
	if len(s.res.Transfers) != 1 || s.res.Transfers[0].Tokens != 0 {
		t.Fatalf("transfers %+v, want 0 tokens (held locally)", s.res.Transfers)
	}
	c.Received("d2")
	drain(t, c)

	// Aborted while receiving: blocks are freed, counters return to zero.
	mustSubmit(t, c, &Request{ID: "d3", Tokens: seqTokens(500, 64), MaxTokens: 1, RemoteKV: true})
	step(c)
	if !c.Abort("d3") || c.Receiving() != 0 || c.KVUsage() != 0 || c.Received("d3") {
		t.Fatalf("abort while receiving: receiving %d usage %v", c.Receiving(), c.KVUsage())
	}
}

// TestCoreRemoteDecodeBlockIDs: a prefill-side request's last output names
// its blocks; other requests' outputs name none.
func TestCoreRemoteDecodeBlockIDs(t *testing.T) {
	c := newTestCore(t, CoreConfig{})
	mustSubmit(t, c, &Request{ID: "p", Tokens: seqTokens(1, 100), MaxTokens: 1, RemoteDecode: true})
	mustSubmit(t, c, &Request{ID: "q", Tokens: seqTokens(900, 100), MaxTokens: 1})
	var got map[string]int = map[string]int{}
	for _, s := range drain(t, c) {
		for _, o := range s.outputs {
			got[o.ID] = len(o.BlockIDs)
		}
	}
	if got["p"] != 7 || got["q"] != 0 { // 101 tokens (prompt + the one output) in blocks of 16
		t.Fatalf("block ids per request %v, want p:7 q:0", got)
	}
}
