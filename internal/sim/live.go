package sim

import (
	"context"

	"kvrouter/internal/bench/report"
	"kvrouter/internal/enginesim"
	"kvrouter/internal/workload"
)

// SetLiveBounds adds to rep, the report of a live replay of w (kvrouter
// bench or demo), the workload's hit-rate bound and its pooled-cache bound
// as Run's reports carry them: PooledBound over the same requests with the
// live fleet's block capacity (engines engines of blocks GPU blocks of
// enginesim.DefaultBlockSize tokens, context length MaxModelLen(blocks)),
// so a live hit rate reads as a share of what the fleet's cache could
// hold.
func SetLiveBounds(ctx context.Context, rep *report.Report, w *workload.Workload, engines, blocks int) error {
	rep.HitRateBound = HitRateBound(w, enginesim.DefaultBlockSize)
	b, err := PooledBound(ctx, Config{Replicas: engines, Engine: enginesim.CoreConfig{NumGPUBlocks: blocks, MaxModelLen: MaxModelLen(blocks)}}, w)
	if err != nil {
		return err
	}
	rep.SetPooledBound(report.PooledBound{HitRate: b.HitRate, CachedTokens: b.CachedTokens, GPUBlocks: b.GPUBlocks, CPUBlocks: b.CPUBlocks})
	return nil
}

// MaxModelLen is the longest sequence an engine with blocks GPU blocks of
// enginesim.DefaultBlockSize tokens accepts: what its cache holds (one
// block is vLLM's null block), at most enginesim.DefaultMaxModelLen.
func MaxModelLen(blocks int) int {
	return min(enginesim.DefaultMaxModelLen, (blocks-1)*enginesim.DefaultBlockSize)
}
