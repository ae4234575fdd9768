package plan

import (
	"errors"
	"fmt"
	"math"
)

// Input is one sizing question. A zero field means the default in its
// comment.
type Input struct {
	// Model is the model's shape. Required.
	Model Model
	// GPUMemory is one GPU's memory in bytes; required unless KVMemory is
	// set.
	GPUMemory float64
	// GPUs is the GPUs in a node (1). TP is the tensor-parallel size of
	// one replica (1); GPUs must be a multiple of it.
	GPUs, TP int
	// Utilization is vLLM's --gpu-memory-utilization (0.9).
	Utilization float64
	// Weights is the weights' size in bytes for the whole replica; 0:
	// Params times the model dtype's bytes.
	Weights float64
	// Params is the parameter count; 0: Model.EstimateParams.
	Params float64
	// Reserve is the bytes per GPU vLLM's profile run keeps besides the
	// weights: peak activations, CUDA graphs, non-torch memory (0; a few
	// GiB in practice, see vLLM's "Available KV cache memory" log line).
	Reserve float64
	// KVMemory, when set, is the KV cache bytes per GPU, replacing the
	// memory arithmetic (vLLM logs it as "Available KV cache memory").
	KVMemory float64
	// KVDType is the KV cache dtype, vLLM's --kv-cache-dtype ("auto": the
	// model's dtype; fp8 halves a 16-bit cache).
	KVDType string
	// BlockSize is the KV block size in tokens (16).
	BlockSize int
	// Contexts are the per-request context lengths of the table in tokens
	// (4096, 8192, 32768, 131072).
	Contexts []int
	// Thinking is the reasoning tokens a request adds to its context (0).
	// ImageTokens is the tokens its images add (0).
	Thinking, ImageTokens int
}

// Result is Compute's answer. Bytes in bytes, memory per GPU unless named.
type Result struct {
	Model Model `json:"model"`
	// KVDType and KVElemBytes are the KV cache's element type and size.
	KVDType     string  `json:"kv_dtype"`
	KVElemBytes float64 `json:"kv_elem_bytes"`
	// KVBytesPerToken is the whole replica's (KVBytesPerToken);
	// KVBytesPerTokenPerGPU one rank's; *FP8 the same with a 1-byte cache.
	KVBytesPerToken          float64 `json:"kv_bytes_per_token"`
	KVBytesPerTokenPerGPU    float64 `json:"kv_bytes_per_token_per_gpu"`
	KVBytesPerTokenFP8       float64 `json:"kv_bytes_per_token_fp8"`
	KVBytesPerTokenPerGPUFP8 float64 `json:"kv_bytes_per_token_per_gpu_fp8"`
	// GPUs, TP and ReplicasPerNode describe the node.
	GPUs            int `json:"gpus"`
	TP              int `json:"tp"`
	ReplicasPerNode int `json:"replicas_per_node"`
	// GPUMemory, Utilization, Params, Weights (replica), WeightsPerGPU,
	// Reserve: the memory arithmetic's terms (0 when KVMemory was given).
	GPUMemory     float64 `json:"gpu_memory_bytes,omitempty"`
	Utilization   float64 `json:"gpu_memory_utilization,omitempty"`
	Params        float64 `json:"params,omitempty"`
	Weights       float64 `json:"weights_bytes,omitempty"`
	WeightsPerGPU float64 `json:"weights_per_gpu_bytes,omitempty"`
	Reserve       float64 `json:"reserve_per_gpu_bytes,omitempty"`
	// KVMemory is the KV cache bytes per GPU.
	KVMemory float64 `json:"kv_memory_per_gpu_bytes"`
	// BlockSize (tokens), BlocksPerGPU and the token capacities: a
	// replica's TP ranks each hold their share of the same tokens, so a
	// replica holds BlocksPerGPU blocks; a node ReplicasPerNode times that.
	BlockSize           int   `json:"block_size"`
	BlocksPerGPU        int64 `json:"blocks_per_gpu"`
	TokensPerReplica    int64 `json:"kv_tokens_per_replica"`
	TokensPerNode       int64 `json:"kv_tokens_per_node"`
	BlocksPerGPUFP8     int64 `json:"blocks_per_gpu_fp8"`
	TokensPerReplicaFP8 int64 `json:"kv_tokens_per_replica_fp8"`
	// Thinking and ImageTokens are added to every context of Rows.
	Thinking    int   `json:"thinking_tokens,omitempty"`
	ImageTokens int   `json:"image_tokens,omitempty"`
	Rows        []Row `json:"concurrency"`
}

// Row is one context length of the concurrency table.
type Row struct {
	// Context is the prompt plus output tokens; RequestTokens adds the
	// thinking budget and image tokens.
	Context       int `json:"context"`
	RequestTokens int `json:"request_tokens"`
	// PerReplica and PerNode are how many such requests fit in the KV cache
	// at once, each holding ceil(RequestTokens / BlockSize) blocks (vLLM
	// allocates whole blocks); *FP8 with an FP8 cache. PerReplicaPlain is
	// PerReplica without the thinking budget and image tokens.
	PerReplica      int64 `json:"per_replica"`
	PerNode         int64 `json:"per_node"`
	PerReplicaFP8   int64 `json:"per_replica_fp8"`
	PerReplicaPlain int64 `json:"per_replica_without_extras"`
	// KVBytes is one request's KV on the whole replica at the cache's dtype;
	// Transfer the seconds to move it over each of Links.
	KVBytes  float64    `json:"kv_bytes"`
	Transfer []Transfer `json:"transfer"`
}

// Transfer is one link's time for one request's KV.
type Transfer struct {
	Link    string  `json:"link"`
	GBps    float64 `json:"gb_per_sec"`
	Seconds float64 `json:"seconds"`
}

// Compute answers in. It returns every problem of the input at once.
func Compute(in Input) (Result, error) {
	var errs []error
	if err := in.Model.Validate(); err != nil {
		errs = append(errs, err)
	}
	if in.GPUs == 0 {
		in.GPUs = 1
	}
	if in.TP == 0 {
		in.TP = 1
	}
	if in.Utilization == 0 {
		in.Utilization = 0.9
	}
	if in.KVDType == "" {
		in.KVDType = "auto"
	}
	if in.BlockSize == 0 {
		in.BlockSize = 16
	}
	if len(in.Contexts) == 0 {
		in.Contexts = []int{4096, 8192, 32768, 131072}
	}
	switch {
	case in.GPUs < 1 || in.TP < 1:
		errs = append(errs, fmt.Errorf("GPUs (%d) and tensor parallel size (%d) must be positive", in.GPUs, in.TP))
	case in.GPUs%in.TP != 0:
		errs = append(errs, fmt.Errorf("%d GPUs do not divide into replicas of tensor parallel size %d", in.GPUs, in.TP))
	}
	if in.Utilization <= 0 || in.Utilization > 1 {
		errs = append(errs, fmt.Errorf("gpu memory utilization %g is not in (0, 1]", in.Utilization))
	}
	if in.BlockSize < 1 {
		errs = append(errs, fmt.Errorf("block size %d must be positive", in.BlockSize))
	}
	for _, c := range in.Contexts {
		if c < 1 {
			errs = append(errs, fmt.Errorf("context %d must be positive", c))
		}
	}
	if in.Thinking < 0 || in.ImageTokens < 0 {
		errs = append(errs, errors.New("thinking budget and image tokens must not be negative"))
	}
	if in.KVMemory < 0 || in.GPUMemory < 0 || in.Weights < 0 || in.Params < 0 || in.Reserve < 0 {
		errs = append(errs, errors.New("memory sizes and parameter counts must not be negative"))
	}
	kvDType := in.KVDType
	if kvDType == "auto" {
		kvDType = in.Model.DType
	}
	elem, err := DTypeBytes(kvDType)
	if err != nil {
		errs = append(errs, fmt.Errorf("kv cache dtype: %w", err))
	}
	if len(errs) > 0 {
		return Result{}, errors.Join(errs...)
	}
	r := Result{
		Model: in.Model, KVDType: kvDType, KVElemBytes: elem,
		KVBytesPerToken:          KVBytesPerToken(in.Model, elem),
		KVBytesPerTokenPerGPU:    KVBytesPerTokenPerGPU(in.Model, elem, in.TP),
		KVBytesPerTokenFP8:       KVBytesPerToken(in.Model, 1),
		KVBytesPerTokenPerGPUFP8: KVBytesPerTokenPerGPU(in.Model, 1, in.TP),
		GPUs:                     in.GPUs, TP: in.TP, ReplicasPerNode: in.GPUs / in.TP,
		BlockSize: in.BlockSize, Thinking: in.Thinking, ImageTokens: in.ImageTokens,
	}
	if in.KVMemory > 0 {
		r.KVMemory = in.KVMemory
	} else {
		if err := r.memory(in); err != nil {
			return Result{}, err
		}
	}
	r.BlocksPerGPU = blocks(r.KVMemory, r.KVBytesPerTokenPerGPU, in.BlockSize)
	r.BlocksPerGPUFP8 = blocks(r.KVMemory, r.KVBytesPerTokenPerGPUFP8, in.BlockSize)
	r.TokensPerReplica = r.BlocksPerGPU * int64(in.BlockSize)
	r.TokensPerReplicaFP8 = r.BlocksPerGPUFP8 * int64(in.BlockSize)
	r.TokensPerNode = r.TokensPerReplica * int64(r.ReplicasPerNode)
	for _, c := range in.Contexts {
		req := c + in.Thinking + in.ImageTokens
		row := Row{
			Context: c, RequestTokens: req,
			PerReplica:      fits(r.BlocksPerGPU, req, in.BlockSize),
			PerReplicaFP8:   fits(r.BlocksPerGPUFP8, req, in.BlockSize),
			PerReplicaPlain: fits(r.BlocksPerGPU, c, in.BlockSize),
			KVBytes:         float64(req) * r.KVBytesPerToken,
		}
		row.PerNode = row.PerReplica * int64(r.ReplicasPerNode)
		for _, l := range Links() {
			row.Transfer = append(row.Transfer, Transfer{l.Name, l.BytesPerSec / 1e9, TransferSeconds(row.KVBytes, l.BytesPerSec)})
		}
		r.Rows = append(r.Rows, row)
	}
	return r, nil
}

// memory fills the memory arithmetic: utilization * GPU memory - weights
// per GPU - reserve.
func (r *Result) memory(in Input) error {
	if in.GPUMemory <= 0 {
		return errors.New("give the GPU memory (or the KV cache memory per GPU directly)")
	}
	r.GPUMemory, r.Utilization, r.Reserve = in.GPUMemory, in.Utilization, in.Reserve
	r.Weights, r.Params = in.Weights, in.Params
	if r.Weights == 0 {
		if r.Params == 0 {
			p, err := in.Model.EstimateParams()
			if err != nil {
				return err
			}
			r.Params = p
		}
		wb, err := DTypeBytes(in.Model.DType)
		if err != nil {
			return err
		}
		r.Weights = r.Params * wb
	}
	r.WeightsPerGPU = r.Weights / float64(in.TP)
	r.KVMemory = in.GPUMemory*in.Utilization - r.WeightsPerGPU - in.Reserve
	if r.KVMemory <= 0 {
		return fmt.Errorf("no memory left for the KV cache: %.2f GiB * %.2f utilization - %.2f GiB weights per GPU - %.2f GiB reserve = %.2f GiB",
			in.GPUMemory/GiB, in.Utilization, r.WeightsPerGPU/GiB, in.Reserve/GiB, r.KVMemory/GiB)
	}
	return nil
}

// GiB and GB are the binary and decimal gigabyte, in bytes.
const (
	GiB = 1 << 30
	GB  = 1e9
)

// blocks is how many whole blocks of blockSize tokens fit in mem bytes.
func blocks(mem, perToken float64, blockSize int) int64 {
	if perToken <= 0 {
		return 0
	}
	return int64(math.Floor(mem / (perToken * float64(blockSize))))
}

// fits is how many requests of tokens fit in n blocks of blockSize.
func fits(n int64, tokens, blockSize int) int64 {
	per := int64((tokens + blockSize - 1) / blockSize)
	return n / per
}
