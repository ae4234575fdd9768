package audit

import "fmt"

// verdict decides m's Verdict and says why, with its numbers. thrash names
// the first replica preempting more than ThrashPreemptionShare of its
// requests ("" for none).
func verdict(m Model, thrash string) (Verdict, string) {
	pct := func(f float64) string { return fmt.Sprintf("%.1f%%", 100*f) }
	switch {
	case m.QueryTokensPerSec == 0:
		return NoTraffic, "no prefix cache queries in the window: send traffic or widen --window"
	case thrash != "":
		var share float64
		for _, r := range m.Replicas {
			if r.Name == thrash {
				share = r.PreemptionShare
			}
		}
		return Thrashing, fmt.Sprintf("replica %s preempts %.2f requests per request finished (over %.2f): its KV cache is too small for the load, "+
			"and re-prefill after preemption counts as prefix cache hits, so the %s hit rate overstates reuse; size the cache first (kvrouter plan)",
			thrash, share, ThrashPreemptionShare, pct(m.HitRate))
	case len(m.Replicas) == 1:
		return OneReplica, fmt.Sprintf("one replica: every request already reaches the only cache (hit rate %s); a router has nothing to choose", pct(m.HitRate))
	case m.HitRate >= HighHitRate:
		return AlreadyHigh, fmt.Sprintf("hit rate already %s under the current distribution: the reuse sits in prefixes every replica holds (a shared system prompt), "+
			"which any balancer gets; a KV-aware router can add at most %s%s. If the reuse is inside conversations, session affinity suffices",
			pct(m.HitRate), pct(m.EstimatedGain), measured(m))
	case m.EstimatedGain < MinGain:
		return LowReuse, fmt.Sprintf("low or scattered reuse: hit rate %s over %d replicas; even a perfect router could reach about %s (+%s%s), under the %s worth a KV-aware router",
			pct(m.HitRate), len(m.Replicas), pct(m.ReachableHitRate), pct(m.EstimatedGain), measured(m), pct(MinGain))
	}
	return WorthIt, fmt.Sprintf("worth it: hit rate %s over %d replicas, a KV-aware router could reach %s (+%s%s), saving up to %.0f prefill tokens/s of %.0f. "+
		"If the reuse is inside conversations with a session id, session affinity (policy session) gets much of it; kv also gets prefixes shared across conversations",
		pct(m.HitRate), len(m.Replicas), pct(m.ReachableHitRate), pct(m.EstimatedGain), measured(m), m.SavedPrefillTokensPerSec, m.QueryTokensPerSec)
}

// measured says where the gain comes from.
func measured(m Model) string {
	if m.GainMeasured {
		return ", measured by kvrouter in shadow mode"
	}
	return fmt.Sprintf(", an upper bound: %d replicas x the hit rate, at most 100%%, less the hit rate", len(m.Replicas))
}
