package plan

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// Model is the part of a model's shape that sizes its KV cache and weights.
type Model struct {
	// Name labels the output (config.json has none; the caller's choice).
	Name string `json:"name,omitempty"`
	// Layers is num_hidden_layers; AttentionHeads num_attention_heads;
	// KVHeads num_key_value_heads (AttentionHeads when absent: multi-head
	// attention); HeadDim head_dim (HiddenSize / AttentionHeads when absent).
	Layers         int `json:"layers"`
	AttentionHeads int `json:"attention_heads"`
	KVHeads        int `json:"kv_heads"`
	HeadDim        int `json:"head_dim"`
	// KVLoraRank and QKRopeHeadDim are the multi-head latent attention
	// (DeepSeek V2/V3) latent sizes; KVLoraRank > 0 means MLA, whose cache
	// holds KVLoraRank + QKRopeHeadDim values per layer per token.
	KVLoraRank    int `json:"kv_lora_rank,omitempty"`
	QKRopeHeadDim int `json:"qk_rope_head_dim,omitempty"`
	// DType is the weights' and default KV cache's dtype (torch_dtype or
	// dtype: bfloat16, float16, float32).
	DType string `json:"dtype"`
	// HiddenSize, IntermediateSize, VocabSize and TieEmbeddings serve the
	// parameter estimate of dense models.
	HiddenSize       int  `json:"hidden_size,omitempty"`
	IntermediateSize int  `json:"intermediate_size,omitempty"`
	VocabSize        int  `json:"vocab_size,omitempty"`
	TieEmbeddings    bool `json:"tie_word_embeddings,omitempty"`
	// MoE is true for mixture-of-experts configs (n_routed_experts,
	// num_experts or num_local_experts present): no parameter estimate.
	MoE bool `json:"moe,omitempty"`
	// MaxContext is max_position_embeddings (tokens; 0 when absent).
	MaxContext int `json:"max_context,omitempty"`
}

// MLA reports whether the model uses multi-head latent attention.
func (m Model) MLA() bool { return m.KVLoraRank > 0 }

// hfConfig is the subset of a Hugging Face config.json read here.
type hfConfig struct {
	Layers           int             `json:"num_hidden_layers"`
	Heads            int             `json:"num_attention_heads"`
	KVHeads          int             `json:"num_key_value_heads"`
	HeadDim          int             `json:"head_dim"`
	Hidden           int             `json:"hidden_size"`
	Intermediate     int             `json:"intermediate_size"`
	Vocab            int             `json:"vocab_size"`
	Tie              bool            `json:"tie_word_embeddings"`
	KVLoraRank       int             `json:"kv_lora_rank"`
	QKRope           int             `json:"qk_rope_head_dim"`
	TorchDType       string          `json:"torch_dtype"`
	DType            string          `json:"dtype"`
	MaxPos           int             `json:"max_position_embeddings"`
	RoutedExperts    int             `json:"n_routed_experts"`
	NumExperts       int             `json:"num_experts"`
	LocalExperts     int             `json:"num_local_experts"`
	TextConfig       json.RawMessage `json:"text_config"`
	QuantizationConf json.RawMessage `json:"quantization_config"`
}

// ParseConfig reads a Hugging Face config.json. A multimodal config's
// text_config, when present, is the language model read. It fails when the
// JSON is malformed or the layers, heads or head dimension cannot be found.
func ParseConfig(data []byte) (Model, error) {
	var c hfConfig
	if err := json.Unmarshal(data, &c); err != nil {
		return Model{}, fmt.Errorf("parse config.json: %w", err)
	}
	if len(c.TextConfig) > 0 && string(c.TextConfig) != "null" {
		var t hfConfig
		if err := json.Unmarshal(c.TextConfig, &t); err != nil {
			return Model{}, fmt.Errorf("parse config.json text_config: %w", err)
		}
		if t.TorchDType == "" && t.DType == "" {
			t.TorchDType, t.DType = c.TorchDType, c.DType
		}
		c = t
	}
	m := Model{
		Layers: c.Layers, AttentionHeads: c.Heads, KVHeads: c.KVHeads, HeadDim: c.HeadDim,
		KVLoraRank: c.KVLoraRank, QKRopeHeadDim: c.QKRope,
		DType:      strings.ToLower(c.TorchDType),
		HiddenSize: c.Hidden, IntermediateSize: c.Intermediate, VocabSize: c.Vocab, TieEmbeddings: c.Tie,
		MoE:        c.RoutedExperts > 0 || c.NumExperts > 0 || c.LocalExperts > 0,
		MaxContext: c.MaxPos,
	}
	if m.DType == "" {
		m.DType = strings.ToLower(c.DType)
	}
	if m.KVHeads == 0 {
		m.KVHeads = m.AttentionHeads
	}
	if m.HeadDim == 0 && m.AttentionHeads > 0 {
		m.HeadDim = m.HiddenSize / m.AttentionHeads
	}
	return m, m.Validate()
}

// Validate reports every missing or impossible figure at once.
func (m Model) Validate() error {
	var errs []error
	if m.Layers <= 0 {
		errs = append(errs, errors.New("layers (num_hidden_layers) must be positive"))
	}
	if m.MLA() {
		if m.QKRopeHeadDim < 0 {
			errs = append(errs, errors.New("qk_rope_head_dim must not be negative"))
		}
	} else {
		if m.KVHeads <= 0 {
			errs = append(errs, errors.New("KV heads (num_key_value_heads or num_attention_heads) must be positive"))
		}
		if m.HeadDim <= 0 {
			errs = append(errs, errors.New("head dim (head_dim, or hidden_size / num_attention_heads) must be positive"))
		}
	}
	const limit = 1 << 20 // far above any model; keeps products exact
	for _, v := range []int{m.Layers, m.AttentionHeads, m.KVHeads, m.HeadDim, m.KVLoraRank, m.QKRopeHeadDim} {
		if v > limit {
			errs = append(errs, fmt.Errorf("a dimension (%d) is over %d", v, limit))
			break
		}
	}
	if _, err := DTypeBytes(m.DType); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// DTypeBytes returns the bytes of one element of a dtype named as
// config.json or vLLM's --kv-cache-dtype name it: float32 4; bfloat16,
// float16 (bf16, fp16, half) 2; fp8, fp8_e4m3, fp8_e5m2, int8 1.
func DTypeBytes(dtype string) (float64, error) {
	switch strings.ToLower(dtype) {
	case "float32", "fp32", "float":
		return 4, nil
	case "bfloat16", "bf16", "float16", "fp16", "half":
		return 2, nil
	case "fp8", "fp8_e4m3", "fp8_e5m2", "float8_e4m3fn", "int8":
		return 1, nil
	}
	return 0, fmt.Errorf("unknown dtype %q (known: float32, bfloat16, float16, fp8, fp8_e4m3, fp8_e5m2, int8)", dtype)
}

// EstimateParams counts a dense decoder's parameters from its shape:
// embeddings (twice unless tied), per layer the Q, K, V and O projections,
// a gated MLP (three matrices) and two norms, and the final norm. It
// ignores biases and per-head norms (under 0.01% for Llama and Qwen). It
// fails for mixture-of-experts and MLA models, whose weights must be given.
func (m Model) EstimateParams() (float64, error) {
	if m.MoE || m.MLA() {
		return 0, errors.New("no parameter estimate for mixture-of-experts or MLA models: give the weights size or parameter count")
	}
	if m.HiddenSize <= 0 || m.IntermediateSize <= 0 || m.VocabSize <= 0 || m.AttentionHeads <= 0 {
		return 0, errors.New("no parameter estimate: hidden_size, intermediate_size, vocab_size and num_attention_heads are needed (or give the weights size or parameter count)")
	}
	h, q, kv := float64(m.HiddenSize), float64(m.AttentionHeads*m.HeadDim), float64(m.KVHeads*m.HeadDim)
	emb := float64(m.VocabSize) * h
	if !m.TieEmbeddings {
		emb *= 2
	}
	layer := h*q + 2*h*kv + q*h + 3*h*float64(m.IntermediateSize) + 2*h
	return emb + float64(m.Layers)*layer + h, nil
}
