package plan

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"kvrouter/internal/enginesim"
)

// load reads a real config.json from testdata/models (see testdata/README.md).
func load(t *testing.T, dir string) Model {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "testdata", "models", dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	m, err := ParseConfig(data)
	if err != nil {
		t.Fatal(err)
	}
	m.Name = dir
	return m
}

// TestKVBytesPerTokenPublished checks the formula on real configs against
// published figures: Llama 3 8B (GQA) 131,072 B/token and 1.00 GiB at 8K
// tokens, Qwen3 8B 147,456, Llama 3 70B 327,680; DeepSeek V3's MLA latent
// 61 * (512 + 64) * 2 = 70,272 B/token.
func TestKVBytesPerTokenPublished(t *testing.T) {
	for _, tt := range []struct {
		dir  string
		want float64
	}{
		{"llama-3.1-8b-instruct", 131072},
		{"qwen3-8b", 147456},
		{"llama-3.1-70b-instruct", 327680},
		{"deepseek-v3", 70272},
	} {
		t.Run(tt.dir, func(t *testing.T) {
			m := load(t, tt.dir)
			if got := KVBytesPerToken(m, 2); got != tt.want {
				t.Errorf("KVBytesPerToken = %v, want %v", got, tt.want)
			}
			if got := KVBytesPerToken(m, 1); got != tt.want/2 {
				t.Errorf("FP8 KVBytesPerToken = %v, want %v", got, tt.want/2)
			}
		})
	}
	if got := 8192 * KVBytesPerToken(load(t, "llama-3.1-8b-instruct"), 2) / GiB; got != 1 {
		t.Errorf("Llama 3 8B at 8K = %v GiB, want 1.00", got)
	}
}

func TestKVBytesPerTokenPerGPU(t *testing.T) {
	l70 := load(t, "llama-3.1-70b-instruct") // 8 KV heads
	for _, tt := range []struct {
		tp   int
		want float64
	}{{1, 327680}, {2, 163840}, {4, 81920}, {8, 40960}, {16, 40960}} { // 16 ranks: one head each, replicated
		if got := KVBytesPerTokenPerGPU(l70, 2, tt.tp); got != tt.want {
			t.Errorf("tp %d: %v, want %v", tt.tp, got, tt.want)
		}
	}
	ds := load(t, "deepseek-v3")
	if got := KVBytesPerTokenPerGPU(ds, 2, 8); got != 70272 {
		t.Errorf("MLA at tp 8: %v, want the whole latent 70272", got)
	}
}

// TestQwen3On24GB: "Qwen3 8B on a 24 GB card with ~6 GB left for KV holds
// ~43K tokens": the figure holds for 6 GiB (6 * 2^30 / 147,456 = 43,690
// tokens, 43,680 in whole blocks of 16); 6 GB (10^9) would be 40,690.
func TestQwen3On24GB(t *testing.T) {
	m := load(t, "qwen3-8b")
	r, err := Compute(Input{Model: m, KVMemory: 6 * GiB})
	if err != nil {
		t.Fatal(err)
	}
	if r.BlocksPerGPU != 2730 || r.TokensPerReplica != 43680 {
		t.Errorf("6 GiB: %d blocks, %d tokens; want 2730, 43680", r.BlocksPerGPU, r.TokensPerReplica)
	}
	r, _ = Compute(Input{Model: m, KVMemory: 6 * GB})
	if r.TokensPerReplica != 40688 { // floor(6e9/147456/16)*16
		t.Errorf("6 GB: %d tokens, want 40688", r.TokensPerReplica)
	}
	// The same card through the memory arithmetic: 24 GiB * 0.9 minus the
	// estimated 8.19e9 bf16 parameters minus 0.25 GiB reserve leaves ~6 GiB.
	r, err = Compute(Input{Model: m, GPUMemory: 24 * GiB, Reserve: 0.25 * GiB})
	if err != nil {
		t.Fatal(err)
	}
	want := 24*GiB*0.9 - r.Params*2 - 0.25*GiB
	if r.KVMemory != want || math.Abs(r.KVMemory/GiB-6) > 0.25 {
		t.Errorf("KV memory %.3f GiB, want %.3f (about 6)", r.KVMemory/GiB, want/GiB)
	}
	if r.TokensPerReplica < 42000 || r.TokensPerReplica > 45000 {
		t.Errorf("tokens %d, want ~43K", r.TokensPerReplica)
	}
}

// TestEstimateParams: the dense estimate against the published counts
// (Llama 3.1 8B 8.03B, Qwen3 8B 8.19B, Llama 3.1 70B 70.6B).
func TestEstimateParams(t *testing.T) {
	for _, tt := range []struct {
		dir  string
		want float64
	}{{"llama-3.1-8b-instruct", 8.03e9}, {"qwen3-8b", 8.19e9}, {"llama-3.1-70b-instruct", 70.6e9}} {
		p, err := load(t, tt.dir).EstimateParams()
		if err != nil {
			t.Fatal(err)
		}
		if math.Abs(p-tt.want)/tt.want > 0.005 {
			t.Errorf("%s: %.4g params, want %.4g within 0.5%%", tt.dir, p, tt.want)
		}
	}
	if _, err := load(t, "deepseek-v3").EstimateParams(); err == nil {
		t.Error("MoE/MLA model estimated; want an error asking for the weights")
	}
}

// TestComputeTable checks the node figures, the block-rounded concurrency,
// the thinking budget and the transfer times by hand for Llama 3 70B on a
// node of 8 GPUs of 80 GiB at TP 4.
func TestComputeTable(t *testing.T) {
	m := load(t, "llama-3.1-70b-instruct")
	r, err := Compute(Input{Model: m, GPUMemory: 80 * GiB, GPUs: 8, TP: 4, Weights: 141.2e9, Reserve: 4 * GiB,
		Contexts: []int{8192, 8200}, Thinking: 1000})
	if err != nil {
		t.Fatal(err)
	}
	kv := 80*GiB*0.9 - 141.2e9/4 - 4*GiB
	if r.KVMemory != kv || r.ReplicasPerNode != 2 {
		t.Fatalf("kv %v want %v, replicas %d", r.KVMemory, kv, r.ReplicasPerNode)
	}
	blocks := int64(math.Floor(kv / (81920 * 16)))
	if r.BlocksPerGPU != blocks || r.TokensPerNode != 2*16*blocks {
		t.Errorf("blocks %d want %d; node tokens %d", r.BlocksPerGPU, blocks, r.TokensPerNode)
	}
	if r.BlocksPerGPUFP8 != int64(math.Floor(kv/(40960*16))) {
		t.Errorf("fp8 blocks %d", r.BlocksPerGPUFP8)
	}
	row := r.Rows[0]
	if row.RequestTokens != 9192 || row.PerReplica != blocks/575 || row.PerReplicaPlain != blocks/512 || row.PerNode != 2*(blocks/575) {
		t.Errorf("row %+v (blocks %d)", row, blocks)
	}
	if r.Rows[1].PerReplicaPlain != blocks/513 { // 8200 tokens take 513 whole blocks
		t.Errorf("8200 tokens: %d, want %d", r.Rows[1].PerReplicaPlain, blocks/513)
	}
	if row.KVBytes != 9192*327680 || row.Transfer[1].Link != "InfiniBand" || row.Transfer[1].Seconds != 9192*327680/50e9 {
		t.Errorf("transfer %+v", row.Transfer)
	}
}

func TestComputeErrors(t *testing.T) {
	m := load(t, "qwen3-8b")
	for _, tt := range []struct {
		name string
		in   Input
		want []string
	}{
		{"no memory", Input{Model: m}, []string{"give the GPU memory"}},
		{"weights too big", Input{Model: m, GPUMemory: 16 * GB}, []string{"no memory left for the KV cache"}},
		{"several at once", Input{Model: m, GPUs: 3, TP: 2, Utilization: 1.5, KVDType: "fp4", BlockSize: -1},
			[]string{"do not divide", "utilization 1.5", "block size -1", `unknown dtype "fp4"`}},
		{"bad model", Input{Model: Model{DType: "bfloat16"}, KVMemory: GiB}, []string{"layers", "KV heads", "head dim"}},
		{"moe needs weights", Input{Model: load(t, "deepseek-v3"), GPUMemory: 141 * GB}, []string{"give the weights size"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Compute(tt.in)
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

func TestParseConfigErrors(t *testing.T) {
	for _, in := range []string{`{`, `{"num_hidden_layers": 2}`, `{"num_hidden_layers":2,"num_attention_heads":4,"hidden_size":64,"torch_dtype":"int3"}`} {
		if _, err := ParseConfig([]byte(in)); err == nil {
			t.Errorf("%s: no error", in)
		}
	}
	// text_config (multimodal) is read, inheriting the outer dtype.
	m, err := ParseConfig([]byte(`{"torch_dtype":"bfloat16","text_config":{"num_hidden_layers":2,"num_attention_heads":4,"hidden_size":64}}`))
	if err != nil || m.Layers != 2 || m.KVHeads != 4 || m.HeadDim != 16 || m.DType != "bfloat16" {
		t.Errorf("text_config: %+v %v", m, err)
	}
}

func TestParseBytes(t *testing.T) {
	for in, want := range map[string]float64{"24GB": 24e9, "24GiB": 24 << 30, "6.5 GiB": 6.5 * GiB, "512MiB": 512 << 20, "100B": 100} {
		if got, err := ParseBytes(in); err != nil || got != want {
			t.Errorf("%q = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"24", "GiB", "-1GB", "x GB", ""} {
		if _, err := ParseBytes(in); err == nil {
			t.Errorf("%q: no error", in)
		}
	}
}

// TestWriteText checks that the text names its units and carries the
// figures of the JSON.
func TestWriteText(t *testing.T) {
	r, err := Compute(Input{Model: load(t, "llama-3.1-8b-instruct"), GPUMemory: 80 * GiB, Reserve: 2 * GiB})
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := r.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"131,072 B/token", "8K tokens: 1.00 GiB (1.07 GB)", "GiB = 2^30 bytes, GB = 10^9 bytes", "NVLink 450 GB/s", thousands(r.TokensPerReplica) + " tokens per replica"} {
		if !strings.Contains(out, want) {
			t.Errorf("text lacks %q:\n%s", want, out)
		}
	}
	j, err := json.Marshal(r)
	if err != nil || !bytes.Contains(j, []byte(`"kv_bytes_per_token":131072`)) {
		t.Errorf("json %s %v", j, err)
	}
}

// FuzzParseConfig: any input either fails or gives a model Compute accepts
// with positive capacity figures.
func FuzzParseConfig(f *testing.F) {
	for _, d := range []string{"llama-3.1-8b-instruct", "qwen3-8b", "deepseek-v3"} {
		data, err := os.ReadFile(filepath.Join("..", "..", "testdata", "models", d, "config.json"))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := ParseConfig(data)
		if err != nil {
			return
		}
		if KVBytesPerToken(m, 2) < 0 {
			t.Fatalf("negative bytes per token for %+v", m)
		}
	})
}

// TestEngineSimProfileFits ties the simulator's h100-llama3-8b profile to
// this package's arithmetic: its 27,000 GPU blocks of 16 tokens are what
// Llama 3.1 8B leaves on an 80 GiB H100 at 0.9 utilization when vLLM's
// profiling run reserves about 4.3 GiB besides the weights (activations
// and CUDA graphs: a plausible 1-8 GiB).
func TestEngineSimProfileFits(t *testing.T) {
	_, blocks, err := enginesim.Profile(enginesim.ProfileH100)
	if err != nil {
		t.Fatal(err)
	}
	m := load(t, "llama-3.1-8b-instruct")
	r, err := Compute(Input{Model: m, GPUMemory: 80 * GiB})
	if err != nil {
		t.Fatal(err)
	}
	reserve := r.KVMemory - float64(blocks)*16*KVBytesPerToken(m, 2)
	if reserve < 1*GiB || reserve > 8*GiB {
		t.Errorf("the profile's %d blocks imply a %.2f GiB reserve, outside 1-8 GiB", blocks, reserve/GiB)
	}
	t.Logf("h100-llama3-8b: %d blocks = %.2f GiB of KV; implied reserve %.2f GiB", blocks, float64(blocks)*16*131072/GiB, reserve/GiB)
}

// TestWriteTextOverMaxContext: the row whose request tokens (context plus
// the thinking budget) pass max_position_embeddings is marked on its
// request tokens, the figure that is over, not on its context, which is
// exactly the limit; without a thinking budget no row is over.
func TestWriteTextOverMaxContext(t *testing.T) {
	m := load(t, "llama-3.1-70b-instruct") // max_position_embeddings 131,072
	for _, tc := range []struct {
		thinking int
		marked   string // the row's context and request tokens cells
	}{{2048, "131,072 133,120 *"}, {0, ""}} {
		r, err := Compute(Input{Model: m, GPUMemory: 80 * GiB, GPUs: 8, TP: 4, Reserve: 4 * GiB, Thinking: tc.thinking})
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		if err := r.WriteText(&b); err != nil {
			t.Fatal(err)
		}
		var marked []string
		for line := range strings.Lines(b.String()) {
			f := strings.Fields(line)
			if len(f) > 2 && strings.Contains(line, "GiB  ") && strings.Contains(line, "*") {
				marked = append(marked, strings.Join(f[:3], " "))
			}
		}
		if got := strings.Join(marked, "; "); got != tc.marked {
			t.Errorf("thinking %d: marked rows %q, want %q:\n%s", tc.thinking, got, tc.marked, b.String())
		}
		foot := "* request tokens (context + thinking + image tokens) over the model's max_position_embeddings (131,072 tokens)"
		if strings.Contains(b.String(), foot) != (tc.marked != "") {
			t.Errorf("thinking %d: footnote %q present = %v:\n%s", tc.thinking, foot, !(tc.marked != ""), b.String())
		}
	}
}
