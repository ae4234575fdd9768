package e2e

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"kvrouter/internal/enginesim"
)

// TestE2ELearnedRates: two engine-sims whose prefill throughput differs 5x
// (30,000 and 6,000 tokens/s) behind serve with no rates configured. From
// the engines' /metrics (vllm:request_prefill_time_seconds and the token
// counters) the router learns each one's prefill rate, exported as
// kvrouter_routing_prefill_rate_tokens_per_second; both start at the
// default 10,000.
func TestE2ELearnedRates(t *testing.T) {
	e2eLeakCheck(t)
	rate := func(r float64) e2eSimOpt {
		return func(c *enginesim.Config) {
			c.Core.Timing = enginesim.Timing{StepOverhead: time.Microsecond, PrefillTokensPerSec: r, DecodePerSeq: time.Microsecond}
		}
	}
	fast, slow := startE2ESim(t, rate(30000)), startE2ESim(t, rate(6000))
	r := startE2ERouter(t, "policy: round_robin\nrouting: {learn_rates: {half_life: 500ms, min_busy: 50ms}}", fast, slow)
	learned := func(replica string) float64 {
		return e2eMetric(t, r.url, "kvrouter_routing_prefill_rate_tokens_per_second", `replica="`+replica+`"`)
	}
	if a, b := learned("e0"), learned("e1"); a != 10000 || b != 10000 {
		t.Fatalf("before traffic: %v and %v, want the default 10000", a, b)
	}
	for i := range 12 {
		ids := make([]string, 3000)
		for j := range ids {
			ids[j] = strconv.Itoa(1000 + (i*3000+j)%100000)
		}
		resp, body := r.post("/v1/completions", fmt.Sprintf(`{"model":"m","max_tokens":2,"prompt":[%s]}`, strings.Join(ids, ",")))
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
		}
	}
	// Unique prompts, one at a time: each engine's summed prefill time is
	// its busy time, so the estimates head for the true rates (e0 gets
	// 0.6 s of prefill, e1 3 s).
	e2eEventually(t, 10*time.Second, "learned rates", func() bool {
		return learned("e0") > 15000 && learned("e1") < 7500 && learned("e1") > 5000
	})
	t.Logf("learned prefill rates: e0 %.0f (true 30000), e1 %.0f (true 6000) tokens/s", learned("e0"), learned("e1"))
}
