package enginesim

import (
	"testing"
	"time"
)

// TestPhaseTimes checks the per-request prefill and decode times the Core
// reports (vLLM's FinishedRequestStats.prefill_time and decode_time) and
// their sums in Stats, against the timing model worked out by hand.
func TestPhaseTimes(t *testing.T) {
	tm := Timing{StepOverhead: time.Millisecond, PrefillTokensPerSec: 1000, DecodePerSeq: time.Millisecond, CPULoadTokensPerSec: 1e9}
	c := newTestCore(t, CoreConfig{BlockSize: 16, NumGPUBlocks: 1000, MaxModelLen: 4096,
		MaxNumBatchedTokens: 256, Timing: tm})
	// 400 tokens at a 256-token budget: steps of 256 and 144 prefill tokens.
	if err := c.Submit(&Request{ID: "a", Tokens: seqTokens(1, 400), MaxTokens: 3}); err != nil {
		t.Fatal(err)
	}
	var outs []Output
	var total time.Duration
	for !c.Idle() {
		res := c.Step()
		total += res.Duration
		outs = append(outs, res.Outputs...)
	}
	last := outs[len(outs)-1]
	if !last.Finished || len(outs) != 3 {
		t.Fatalf("outputs %+v", outs)
	}
	// Prefill: (1 ms + 256 ms) + (1 ms + 144 ms); decode: two steps of
	// 1 ms overhead + 1 ms per sequence.
	wantPrefill := 402 * time.Millisecond
	wantDecode := 4 * time.Millisecond
	if last.PrefillTime != wantPrefill || last.DecodeTime != wantDecode {
		t.Errorf("prefill %v decode %v, want %v %v", last.PrefillTime, last.DecodeTime, wantPrefill, wantDecode)
	}
	if total != wantPrefill+wantDecode {
		t.Errorf("steps took %v, want %v", total, wantPrefill+wantDecode)
	}
	s := c.Stats()
	if s.PrefillSeconds != wantPrefill.Seconds() || s.DecodeSeconds != wantDecode.Seconds() || s.PrefillComputedTokens != 400 {
		t.Errorf("stats prefill %v s decode %v s computed %d, want %v %v 400", s.PrefillSeconds, s.DecodeSeconds, s.PrefillComputedTokens, wantPrefill.Seconds(), wantDecode.Seconds())
	}
}
