package report

import (
	"fmt"
	"strings"
)

// PooledBound is the pooled-cache bound of a workload: the prefix cache
// hits of one engine whose cache holds all of the fleet's blocks as one
// LRU, serving the requests one at a time in arrival order (the fleet
// simulator's sim.PooledBound). What a policy caches over what it caches
// is how much of the fleet's cache the policy's placement puts to use.
type PooledBound struct {
	// HitRate is CachedTokens over the prompt tokens.
	HitRate float64 `json:"hit_rate"`
	// CachedTokens is the prompt tokens found cached (prefill tokens saved).
	CachedTokens int64 `json:"cached_tokens"`
	// GPUBlocks and CPUBlocks are the pooled cache's size in blocks.
	GPUBlocks int `json:"gpu_blocks"`
	CPUBlocks int `json:"cpu_blocks,omitempty"`
}

// SetPooledBound records b and sets each policy's ShareOfPooledBound (none
// when b caches nothing).
func (r *Report) SetPooledBound(b PooledBound) {
	r.PooledBound = &b
	for i := range r.Policies {
		p := &r.Policies[i]
		p.ShareOfPooledBound = nil
		if b.CachedTokens > 0 {
			v := float64(p.CachedTokens) / float64(b.CachedTokens)
			p.ShareOfPooledBound = &v
		}
	}
}

// pooledMarkdown appends the pooled bound's sentence, if any.
func (r *Report) pooledMarkdown(b *strings.Builder) {
	pb := r.PooledBound
	if pb == nil {
		return
	}
	fmt.Fprintf(b, " Pooled-cache bound (the fleet's %d GPU", pb.GPUBlocks)
	if pb.CPUBlocks > 0 {
		fmt.Fprintf(b, " + %d CPU", pb.CPUBlocks)
	}
	fmt.Fprintf(b, " blocks as one LRU, requests in arrival order; a reference, not a ceiling): %s", pct(pb.HitRate))
	var parts []string
	for _, p := range r.Policies {
		if p.ShareOfPooledBound != nil {
			parts = append(parts, fmt.Sprintf("%s %.2f", p.Name, *p.ShareOfPooledBound))
		}
	}
	if len(parts) > 0 {
		fmt.Fprintf(b, "; share of its cached tokens: %s", strings.Join(parts, ", "))
	}
	b.WriteString(".")
}
