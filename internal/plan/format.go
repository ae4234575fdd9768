package plan

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
)

// ParseBytes reads a size with an explicit unit: B, KB, MB, GB, TB
// (decimal) or KiB, MiB, GiB, TiB (binary), e.g. "24GB", "80GiB",
// "6.5 GiB". A bare number is refused: GB and GiB differ by 7%.
func ParseBytes(s string) (float64, error) {
	t := strings.TrimSpace(s)
	units := []struct {
		suffix string
		mult   float64
	}{
		{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
		{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"B", 1},
	}
	for _, u := range units {
		if !strings.HasSuffix(t, u.suffix) {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), 64)
		if err != nil || v < 0 {
			return 0, fmt.Errorf("size %q: want a non-negative number and a unit (GB, GiB, ...)", s)
		}
		return v * u.mult, nil
	}
	return 0, fmt.Errorf("size %q has no unit: write e.g. 24GB (10^9 bytes) or 24GiB (2^30 bytes)", s)
}

// gib prints bytes as "N.NN GiB (N.NN GB)".
func gib(b float64) string { return fmt.Sprintf("%.2f GiB (%.2f GB)", b/GiB, b/GB) }

// thousands prints n with comma separators.
func thousands(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// seconds prints a duration in seconds with a fitting unit.
func seconds(s float64) string {
	switch {
	case s < 1e-3:
		return fmt.Sprintf("%.0f µs", s*1e6)
	case s < 1:
		return fmt.Sprintf("%.1f ms", s*1e3)
	}
	return fmt.Sprintf("%.2f s", s)
}

// WriteText prints r for people, every figure with its unit.
func (r Result) WriteText(w io.Writer) error {
	var b strings.Builder
	m := r.Model
	name := m.Name
	if name == "" {
		name = "model"
	}
	if m.MLA() {
		fmt.Fprintf(&b, "%s: %d layers, MLA latent %d + rope %d per layer, weights %s\n", name, m.Layers, m.KVLoraRank, m.QKRopeHeadDim, m.DType)
		fmt.Fprintf(&b, "KV per token: %d layers * (%d + %d) * %g B (%s) = %s B/token (whole replica; MLA is replicated on every TP rank)\n",
			m.Layers, m.KVLoraRank, m.QKRopeHeadDim, r.KVElemBytes, r.KVDType, thousands(int64(r.KVBytesPerToken)))
	} else {
		fmt.Fprintf(&b, "%s: %d layers, %d attention heads, %d KV heads, head dim %d, weights %s\n", name, m.Layers, m.AttentionHeads, m.KVHeads, m.HeadDim, m.DType)
		fmt.Fprintf(&b, "KV per token: 2 * %d layers * %d KV heads * %d head dim * %g B (%s) = %s B/token (whole replica)\n",
			m.Layers, m.KVHeads, m.HeadDim, r.KVElemBytes, r.KVDType, thousands(int64(r.KVBytesPerToken)))
	}
	fmt.Fprintf(&b, "  per GPU at TP %d: %s B/token; with an FP8 KV cache: %s B/token (per GPU %s)\n",
		r.TP, thousands(int64(r.KVBytesPerTokenPerGPU)), thousands(int64(r.KVBytesPerTokenFP8)), thousands(int64(r.KVBytesPerTokenPerGPUFP8)))
	fmt.Fprintf(&b, "  8K tokens: %s; 128K tokens: %s\n", gib(8192*r.KVBytesPerToken), gib(131072*r.KVBytesPerToken))
	if r.GPUMemory > 0 {
		est := ""
		if r.Params > 0 {
			est = fmt.Sprintf(" (%.2fB parameters * %s)", r.Params/1e9, m.DType)
		}
		fmt.Fprintf(&b, "Memory per GPU: %s * %.2f utilization - weights %s%s / TP %d - reserve %s\n  = KV cache %s\n",
			gib(r.GPUMemory), r.Utilization, gib(r.Weights), est, r.TP, gib(r.Reserve), gib(r.KVMemory))
	} else {
		fmt.Fprintf(&b, "KV cache per GPU (given): %s\n", gib(r.KVMemory))
	}
	fmt.Fprintf(&b, "Capacity: %s blocks of %d tokens per GPU = %s tokens per replica (TP %d); %d replicas per node of %d GPUs = %s tokens per node\n",
		thousands(r.BlocksPerGPU), r.BlockSize, thousands(r.TokensPerReplica), r.TP, r.ReplicasPerNode, r.GPUs, thousands(r.TokensPerNode))
	fmt.Fprintf(&b, "  with an FP8 KV cache: %s blocks per GPU = %s tokens per replica\n", thousands(r.BlocksPerGPUFP8), thousands(r.TokensPerReplicaFP8))
	extra := ""
	if r.Thinking > 0 || r.ImageTokens > 0 {
		extra = fmt.Sprintf(" (each request adds %d thinking + %d image tokens)", r.Thinking, r.ImageTokens)
	}
	fmt.Fprintf(&b, "\nConcurrent requests that fit%s:\n", extra)
	if _, err := io.WriteString(w, b.String()); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := "context\trequest tokens\tper replica\tper node\tFP8 KV per replica\twithout extras\tKV/request\t"
	for _, l := range Links() {
		head += fmt.Sprintf("%s %.0f GB/s\t", l.Name, l.BytesPerSec/1e9)
	}
	fmt.Fprintln(tw, head)
	over := false
	for _, row := range r.Rows {
		mark := ""
		if m.MaxContext > 0 && row.RequestTokens > m.MaxContext {
			mark, over = " *", true
		}
		// The mark goes on the figure that is over: request tokens (context
		// plus thinking and image tokens), not the context, which may be
		// exactly max_position_embeddings.
		line := fmt.Sprintf("%s\t%s%s\t%s\t%s\t%s\t%s\t%.2f GiB\t", thousands(int64(row.Context)), thousands(int64(row.RequestTokens)), mark,
			thousands(row.PerReplica), thousands(row.PerNode), thousands(row.PerReplicaFP8), thousands(row.PerReplicaPlain), row.KVBytes/GiB)
		for _, t := range row.Transfer {
			line += seconds(t.Seconds) + "\t"
		}
		fmt.Fprintln(tw, line)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if over {
		fmt.Fprintf(w, "\n* request tokens (context + thinking + image tokens) over the model's max_position_embeddings (%s tokens)\n", thousands(int64(m.MaxContext)))
	}
	_, err := fmt.Fprintln(w, "\nTransfer: one request's KV (whole replica, one link, no latency), a lower bound. GiB = 2^30 bytes, GB = 10^9 bytes.")
	return err
}
