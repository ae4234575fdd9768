package proxy

import (
	"strings"
	"testing"
	"time"
)

func TestParseConfig(t *testing.T) {
	src := `listen: 127.0.0.1:9000
body_limit: 1048576
health:
  probe_interval: 2s
models:
  - name: llama
    policy: kv
    tokenizer: none
    retries: -1
    timeouts: {first_byte: 30s}
    routing:
      prefill_rate: 20000
      kv: {cpu_weight: 0.5}
    index: {predict_ttl: 3s}
    engines:
      - url: http://10.0.0.1:8000
        events: tcp://10.0.0.1:5557
        replay: tcp://10.0.0.1:5558
        dp_size: 2
        api_key_env: LLAMA_KEY
      - url: http://10.0.0.2:8000
`
	env := map[string]string{"LLAMA_KEY": "s3cret", "KVROUTER_API_KEY": "front"}
	cfg, _, err := ParseConfig([]byte(src), func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	m := cfg.Models[0]
	checks := []struct {
		name      string
		got, want any
	}{
		{"listen", cfg.Listen, "127.0.0.1:9000"},
		{"body_limit", cfg.BodyLimit, int64(1 << 20)},
		{"drain_timeout default", cfg.DrainTimeout, 30 * time.Second},
		{"api key from env", cfg.APIKey, "front"},
		{"probe_interval", cfg.Health.ProbeInterval, 2 * time.Second},
		{"retries -1 = none", m.Retries, 0},
		{"first_byte", m.Timeouts.FirstByte, 30 * time.Second},
		{"connect default", m.Timeouts.Connect, 5 * time.Second},
		{"idle default", m.Timeouts.Idle, 60 * time.Second},
		{"session headers default", strings.Join(m.SessionHeaders, ","), "x-session-id"},
		{"prefill_rate", m.Routing.PrefillRate, 20000.0},
		{"kv cpu_weight", m.Routing.KV.CPUWeight, 0.5},
		{"predict_ttl", m.Index.PredictTTL, 3 * time.Second},
		{"engine key from env", m.Engines[0].APIKey, "s3cret"},
		{"dp_size", m.Engines[0].DPSize, 2},
		{"dp_size default", m.Engines[1].DPSize, 1},
		{"hit report on", m.DisableHitReport, false},
		{"mismatch default", m.TokenizerMismatch, "render"},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	d, _, err := ParseConfig([]byte("models: [{name: m, engines: [{url: 'http://a:1'}]}]"), func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	if dm := d.Models[0]; d.Listen != ":8080" || d.BodyLimit != 32<<20 || dm.Policy != "kv" || dm.Tokenizer != "render" || dm.Retries != 1 ||
		dm.Timeouts.FirstByte != 5*time.Minute || dm.ShadowServe != "round_robin" {
		t.Errorf("defaults: %+v %+v", d, dm)
	}
}

func TestParseConfigErrors(t *testing.T) {
	tests := []struct {
		name, src string
		want      []string
	}{
		{"unknown field names field and line", "listen: x\nmodels:\n  - name: m\n    polcy: kv\n", []string{"line 4", "polcy"}},
		{"wrong type", "body_limit: lots\n", []string{"line 1", "body_limit"}},
		{"empty file", "", []string{"empty"}},
		{"no models", "listen: ':1'\n", []string{"models (line 1): at least one model"}},
		{"bad engine url with line", "models:\n  - name: m\n    engines:\n      - url: ftp://x\n", []string{"models[0].engines[0].url (line 4)", "want http(s)"}},
		{"unknown policy with line", "models:\n  - name: m\n    policy: fastest\n    engines: [{url: 'http://a:1'}]\n", []string{"models[0].policy (line 3)", `unknown policy "fastest"`}},
		{"bad events address", "models:\n  - name: m\n    engines:\n      - {url: 'http://a:1', events: '10.0.0.1:5557'}\n", []string{"models[0].engines[0].events (line 4)"}},
		{"duplicate model and engine", "models:\n  - name: m\n    engines: [{url: 'http://a:1'}]\n  - name: m\n    engines: [{url: 'http://a:1'}]\n",
			[]string{"models[1].name (line 4): duplicate model", "models[1].engines[0] (line 5): engine \"http://a:1\" already listed"}},
		{"missing name and engines", "models:\n  - policy: kv\n", []string{"models[0].name (line 2): required", "models[0].engines (line 2)"}},
		{"bad mismatch reaction", "models:\n  - name: m\n    tokenizer_mismatch: panic\n    engines: [{url: 'http://a:1'}]\n", []string{"tokenizer_mismatch (line 3)"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := ParseConfig([]byte(tt.src), func(string) string { return "" })
			if err == nil {
				t.Fatal("want an error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}
