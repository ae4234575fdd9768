package tokenizer

import (
	"strings"
	"testing"
)

func TestParseConfig(t *testing.T) {
	for _, c := range []struct {
		name, json         string
		bos, eos, template string
		addBOS, addEOS     bool
		err                string
	}{
		{name: "absent", json: ""},
		{name: "strings", json: `{"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": true, "chat_template": "{{ bos_token }}"}`,
			bos: "<s>", eos: "</s>", addBOS: true, template: `"{{ bos_token }}"`},
		{name: "objects", json: `{"bos_token": {"__type": "AddedToken", "content": "<|begin_of_text|>", "lstrip": false}, "eos_token": {"content": "<|eot_id|>"}, "add_eos_token": true}`,
			bos: "<|begin_of_text|>", eos: "<|eot_id|>", addEOS: true},
		{name: "nulls", json: `{"bos_token": null, "eos_token": null, "chat_template": null, "add_bos_token": null}`},
		{name: "template list", json: `{"chat_template": [{"name": "default", "template": "a"}, {"name": "tool_use", "template": "b"}]}`,
			template: `[{"name": "default", "template": "a"}, {"name": "tool_use", "template": "b"}]`},
		{name: "bad json", json: `{`, err: "tokenizer_config.json"},
		{name: "bad bos", json: `{"bos_token": 3}`, err: "bos_token"},
		{name: "object without content", json: `{"eos_token": {"x": 1}}`, err: "eos_token"},
		{name: "bad add_bos", json: `{"add_bos_token": "yes"}`, err: "add_bos_token"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := parseConfig([]byte(c.json))
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err = %v, want %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.BOSToken != c.bos || cfg.EOSToken != c.eos || cfg.AddBOSToken != c.addBOS || cfg.AddEOSToken != c.addEOS || string(cfg.ChatTemplate) != c.template {
				t.Errorf("got %+v", cfg)
			}
		})
	}
}

func TestQwenConfig(t *testing.T) {
	cfg := loadQwen(t).Config()
	if cfg.EOSToken != "<|im_end|>" || cfg.AddBOSToken || len(cfg.ChatTemplate) == 0 || cfg.ChatTemplate[0] != '"' {
		t.Errorf("Qwen3 config: eos %q add_bos %v template %.40s", cfg.EOSToken, cfg.AddBOSToken, cfg.ChatTemplate)
	}
	if _, ok := cfg.Raw["added_tokens_decoder"]; !ok {
		t.Error("Raw lacks added_tokens_decoder")
	}
}
