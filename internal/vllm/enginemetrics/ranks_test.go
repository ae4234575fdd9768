package enginemetrics

import (
	"reflect"
	"strings"
	"testing"
)

// TestParseLoRAInfo reads vllm:lora_requests_info as vLLM's
// PrometheusStatLogger leaves it: one series per state seen, each set to
// the time it was last current; the newest is the state now.
func TestParseLoRAInfo(t *testing.T) {
	text := `# HELP vllm:lora_requests_info Running stats on lora requests.
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="2",running_lora_adapters="",waiting_lora_adapters=""} 1.7545309e+09
vllm:lora_requests_info{max_lora="2",running_lora_adapters="sql-lora,chat-lora",waiting_lora_adapters="math"} 1.7545312e+09
vllm:lora_requests_info{max_lora="2",running_lora_adapters="sql-lora",waiting_lora_adapters=""} 1.7545310e+09
`
	m, err := Parse(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	want := &LoRAInfo{MaxLoRA: 2, Running: []string{"chat-lora", "sql-lora"}, Waiting: []string{"math"}}
	if !reflect.DeepEqual(m.LoRA, want) {
		t.Errorf("LoRA = %+v, want %+v", m.LoRA, want)
	}
	if m, _ := Parse(strings.NewReader(sampleMetrics)); m.LoRA != nil {
		t.Errorf("no lora_requests_info: LoRA = %+v, want nil", m.LoRA)
	}
}
