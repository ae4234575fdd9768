package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
)

// runPlanCmd runs "kvrouter plan" in-process and returns stdout, stderr
// and the exit code.
func runPlanCmd(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(context.Background(), append([]string{"plan"}, args...), stdio{strings.NewReader(""), &out, &errb})
	return out.String(), errb.String(), code
}

// TestPlanCommand checks the command's JSON on real config.json files and
// the flags that complete or override them.
func TestPlanCommand(t *testing.T) {
	for _, tt := range []struct {
		name      string
		args      []string
		perToken  float64
		perGPU    float64
		tokensRep int64
	}{
		{"llama 8B, 1 GiB", []string{"--config", "../../testdata/models/llama-3.1-8b-instruct/config.json", "--kv-memory", "1GiB"}, 131072, 131072, 8192},
		{"qwen3 8B, 6 GiB", []string{"--config", "../../testdata/models/qwen3-8b/config.json", "--kv-memory", "6GiB"}, 147456, 147456, 43680},
		{"llama 70B TP 4", []string{"--config", "../../testdata/models/llama-3.1-70b-instruct/config.json", "--kv-memory", "10GiB", "--tp", "4", "--gpus", "8"}, 327680, 81920, 131072},
		{"flags only, fp8", []string{"--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--kv-cache-dtype", "fp8", "--kv-memory", "1GiB"}, 65536, 65536, 16384},
		{"config overridden", []string{"--config", "../../testdata/models/qwen3-8b/config.json", "--layers", "18", "--kv-memory", "6GiB"}, 73728, 73728, 87376},
	} {
		t.Run(tt.name, func(t *testing.T) {
			out, stderr, code := runPlanCmd(t, append(tt.args, "--json")...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, stderr)
			}
			var r struct {
				PerToken  float64 `json:"kv_bytes_per_token"`
				PerGPU    float64 `json:"kv_bytes_per_token_per_gpu"`
				TokensRep int64   `json:"kv_tokens_per_replica"`
				TokensNod int64   `json:"kv_tokens_per_node"`
				GPUs, TP  int
			}
			if err := json.Unmarshal([]byte(out), &r); err != nil {
				t.Fatal(err)
			}
			if r.PerToken != tt.perToken || r.PerGPU != tt.perGPU || r.TokensRep != tt.tokensRep || r.TokensNod != tt.tokensRep*int64(r.GPUs/r.TP) {
				t.Errorf("got %+v, want per token %v, per GPU %v, tokens %d", r, tt.perToken, tt.perGPU, tt.tokensRep)
			}
		})
	}
}

func TestPlanCommandErrors(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--gpu-memory", "24"}, "has no unit"},
		{[]string{"--config", "../../testdata/models/qwen3-8b/config.json"}, "give the GPU memory"},
		{[]string{"--config", "nope/config.json", "--kv-memory", "1GiB"}, "no such file"},
		{[]string{"--kv-memory", "1GiB"}, "layers"},
		{[]string{"--config", "../../testdata/models/qwen3-8b/config.json", "--kv-memory", "1GiB", "--context", "8k"}, `"8k" is not a token count`},
	} {
		_, stderr, code := runPlanCmd(t, tt.args...)
		if code == 0 || !strings.Contains(stderr, tt.want) {
			t.Errorf("%v: exit %d, stderr %q, want %q", tt.args, code, stderr, tt.want)
		}
	}
}
