package enginesim

import (
	"fmt"
	"testing"
	"time"
)

// ttft submits r to c and steps on a virtual clock until its first token,
// returning the virtual time it took.
func ttft(t *testing.T, c *Core, r *Request) (time.Duration, Output) {
	t.Helper()
	mustSubmit(t, c, r)
	var now time.Duration
	for range 1000 {
		res := c.Step()
		now += res.Duration
		for _, o := range res.Outputs {
			if o.ID == r.ID && o.Index == 0 {
				return now, o
			}
		}
	}
	t.Fatal("no first token in 1000 steps")
	return 0, Output{}
}

// TestTTFTRepeatedLongPrompt: on the H100 profile, a 20,000-token prompt is
// prefilled in ceil(20000/8192) = 3 chunks; repeated, it hits 1249 blocks
// (19,984 tokens: n-1 rounded down to blocks of 16) and prefills only 16.
func TestTTFTRepeatedLongPrompt(t *testing.T) {
	c, err := NewCore(CoreConfig{Profile: ProfileH100})
	if err != nil {
		t.Fatal(err)
	}
	tm, _, _ := Profile(ProfileH100)
	secs := func(tokens float64) time.Duration {
		return time.Duration(tokens / tm.PrefillTokensPerSec * float64(time.Second))
	}
	prompt := seqTokens(1, 20000)
	cold, o := ttft(t, c, &Request{ID: "cold", Tokens: prompt, MaxTokens: 1})
	// Three chunks: 8192 + 8192 + 3616 tokens, each with the step overhead.
	wantCold := 3*tm.StepOverhead + secs(8192) + secs(8192) + secs(3616)
	if cold != wantCold || o.CachedTokens != 0 {
		t.Fatalf("cold TTFT %v (cached %d), want %v", cold, o.CachedTokens, wantCold)
	}
	warm, o := ttft(t, c, &Request{ID: "warm", Tokens: prompt, MaxTokens: 1})
	wantWarm := tm.StepOverhead + secs(16)
	if warm != wantWarm || o.CachedTokens != 19984 {
		t.Fatalf("warm TTFT %v (cached %d), want %v (cached 19984)", warm, o.CachedTokens, wantWarm)
	}
	// Half the prompt shared (10,000 tokens = 625 whole blocks): the other
	// half is prefilled in two chunks.
	half := append(seqTokens(1, 10000), seqTokens(900000, 10000)...)
	part, o := ttft(t, c, &Request{ID: "half", Tokens: half, MaxTokens: 1})
	wantPart := 2*tm.StepOverhead + secs(8192) + secs(10000-8192)
	if part != wantPart || o.CachedTokens != 10000 {
		t.Fatalf("half-shared TTFT %v (cached %d), want %v (cached 10000)", part, o.CachedTokens, wantPart)
	}
	t.Logf("TTFT cold %v, warm %v, half-shared %v", cold, warm, part)
}

// TestDecodeStepTime: a decode step of b sequences lasts overhead + b x
// per-sequence cost.
func TestDecodeStepTime(t *testing.T) {
	c := newTestCore(t, CoreConfig{Profile: ProfileH100})
	for i := range 8 {
		mustSubmit(t, c, &Request{ID: fmt.Sprint(i), Tokens: seqTokens(i*1000, 100), MaxTokens: 3})
	}
	c.Step() // prefill all
	res := c.Step()
	tm := c.Config().Timing
	if res.DecodeSeqs != 8 || res.Duration != tm.StepOverhead+8*tm.DecodePerSeq {
		t.Fatalf("decode step %+v", res)
	}
}
