package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"kvrouter/internal/plan"
)

const planSynopsis = "(--config config.json | --layers N --kv-heads N --head-dim N --dtype T) (--gpu-memory 80GiB | --kv-memory 60GiB) [flags]"

// runPlan implements "kvrouter plan": KV bytes per token, tokens and
// blocks per GPU, replica and node, requests that fit per context length
// (FP8 cache, thinking budget, image tokens) and the KV transfer time per
// request over NVLink, InfiniBand, RoCE and TCP (internal/plan).
func runPlan(ctx context.Context, args []string, sio stdio) error {
	fs := newFlagSet("plan", planSynopsis, sio.err)
	configPath := fs.String("config", "", "the model's Hugging Face config.json (the flags below override its figures)")
	name := fs.String("name", "", "model name for the output (default: config.json's directory name)")
	layers := fs.Int("layers", 0, "num_hidden_layers")
	heads := fs.Int("attention-heads", 0, "num_attention_heads")
	kvHeads := fs.Int("kv-heads", 0, "num_key_value_heads")
	headDim := fs.Int("head-dim", 0, "head_dim")
	loraRank := fs.Int("kv-lora-rank", 0, "MLA kv_lora_rank (DeepSeek V2/V3; > 0 means MLA)")
	rope := fs.Int("qk-rope-head-dim", 0, "MLA qk_rope_head_dim")
	dtype := fs.String("dtype", "", "weights dtype (torch_dtype): bfloat16, float16, float32, fp8")
	gpuMem := fs.String("gpu-memory", "", "one GPU's memory with its unit: 80GiB, 24GB (GiB = 2^30 bytes, GB = 10^9)")
	gpus := fs.Int("gpus", 1, "GPUs per node")
	tp := fs.Int("tp", 1, "tensor parallel size of one replica")
	util := fs.Float64("gpu-memory-utilization", 0.9, "vLLM's --gpu-memory-utilization")
	weights := fs.String("weights", "", "weights size of one replica with its unit (default: parameters * dtype bytes)")
	params := fs.Float64("params", 0, "parameter count, e.g. 8.03e9 (default: estimated from config.json for dense models)")
	reserve := fs.String("reserve", "0GiB", "memory per GPU vLLM keeps besides weights: activations, CUDA graphs (a few GiB; vLLM's start-up log shows it)")
	kvMem := fs.String("kv-memory", "", "KV cache memory per GPU, replacing the memory arithmetic (vLLM logs \"Available KV cache memory\")")
	kvDType := fs.String("kv-cache-dtype", "auto", "vLLM's --kv-cache-dtype: auto (the model's dtype) or fp8")
	blockSize := fs.Int("block-size", 16, "KV block size in tokens")
	contexts := fs.String("context", "4096,8192,32768,131072", "comma-separated context lengths (tokens) of the concurrency table")
	thinking := fs.Int("thinking", 0, "thinking budget: reasoning tokens each request adds")
	images := fs.Int("image-tokens", 0, "image tokens each request adds")
	asJSON := fs.Bool("json", false, "print JSON instead of text")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	shape := set["layers"] || set["attention-heads"] || set["kv-heads"] || set["head-dim"] || set["kv-lora-rank"] || set["qk-rope-head-dim"] || set["dtype"]
	var m plan.Model
	if *configPath != "" {
		data, err := os.ReadFile(*configPath)
		if err != nil {
			return err
		}
		// Flags fill or override; validation runs once they are in.
		cm, err := plan.ParseConfig(data)
		if err != nil && !shape { // a config missing a figure the flags complete
			return fmt.Errorf("%s: %w", *configPath, err)
		}
		m = cm
		m.Name = filepath.Base(filepath.Dir(*configPath))
	}
	for _, o := range []struct {
		flag     string
		src, dst *int
	}{{"layers", layers, &m.Layers}, {"attention-heads", heads, &m.AttentionHeads}, {"kv-heads", kvHeads, &m.KVHeads},
		{"head-dim", headDim, &m.HeadDim}, {"kv-lora-rank", loraRank, &m.KVLoraRank}, {"qk-rope-head-dim", rope, &m.QKRopeHeadDim}} {
		if set[o.flag] {
			*o.dst = *o.src
		}
	}
	if m.KVHeads == 0 {
		m.KVHeads = m.AttentionHeads
	}
	if set["dtype"] {
		m.DType = *dtype
	}
	if *name != "" {
		m.Name = *name
	}
	if *configPath == "" && !set["dtype"] {
		m.DType = "bfloat16"
	}
	in := plan.Input{Model: m, GPUs: *gpus, TP: *tp, Utilization: *util, Params: *params,
		KVDType: *kvDType, BlockSize: *blockSize, Thinking: *thinking, ImageTokens: *images}
	var errs []error
	for _, sz := range []struct {
		flag, v string
		dst     *float64
	}{{"gpu-memory", *gpuMem, &in.GPUMemory}, {"weights", *weights, &in.Weights}, {"reserve", *reserve, &in.Reserve}, {"kv-memory", *kvMem, &in.KVMemory}} {
		if sz.v == "" {
			continue
		}
		var err error
		if *sz.dst, err = plan.ParseBytes(sz.v); err != nil {
			errs = append(errs, fmt.Errorf("--%s: %v", sz.flag, err))
		}
	}
	for _, c := range strings.Split(*contexts, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(c))
		if err != nil {
			errs = append(errs, fmt.Errorf("--context: %q is not a token count", c))
			continue
		}
		in.Contexts = append(in.Contexts, n)
	}
	if *gpus < 1 || *tp < 1 {
		errs = append(errs, fmt.Errorf("--gpus and --tp must be positive"))
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %v", errUsage, errors.Join(errs...))
	}
	r, err := plan.Compute(in)
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if *asJSON {
		enc := json.NewEncoder(sio.out)
		enc.SetIndent("", "  ")
		return enc.Encode(r)
	}
	return r.WriteText(sio.out)
}
