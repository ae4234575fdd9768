package discovery

import (
	"strings"
	"testing"

	"kvrouter/internal/config"
)

func TestInferencePoolConfig(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  config.Discovery
		err  string // "" for valid
	}{
		{"pool", config.Discovery{Namespace: "vllm", InferencePool: "llama"}, ""},
		{"pool with selector", config.Discovery{Namespace: "vllm", InferencePool: "llama", Selector: "tier=gpu"}, ""},
		{"pool and service", config.Discovery{Namespace: "vllm", InferencePool: "llama", Service: "vllm"}, "inference_pool: excludes service"},
		{"bad pool name", config.Discovery{Namespace: "vllm", InferencePool: "Llama_3"}, "inference_pool"},
		{"nothing", config.Discovery{Namespace: "vllm"}, "service, selector or inference_pool is required"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := c.cfg.WithDefaults()
			if c.err == "" {
				if err != nil {
					t.Fatal(err)
				}
				if !got.PodAnnotations || got.Name != "vllm/inferencepool/llama" {
					t.Errorf("defaults: pod annotations %v, name %q", got.PodAnnotations, got.Name)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Fatalf("err %v, want %q", err, c.err)
			}
		})
	}
}
