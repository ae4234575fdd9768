package config

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
        replay: tcp://10.0.0.1:5600
        dp_size: 2
        idle_check: 2s
        events_queue: 4096
        api_key_env: LLAMA_KEY
      - url: http://10.0.0.2:8000
`
	env := map[string]string{"LLAMA_KEY": "s3cret", "KVROUTER_API_KEY": "front"}
	cfg, _, err := Parse([]byte(src), func(k string) string { return env[k] })
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
		{"idle_check", m.Engines[0].IdleCheck, 2 * time.Second},
		{"events_queue", m.Engines[0].EventsQueue, 4096},
		{"events_queue default", m.Engines[1].EventsQueue, 1024},
		{"hit report on", m.DisableHitReport, false},
		{"mismatch default", m.TokenizerMismatch, "render"},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	d, _, err := Parse([]byte("models: [{name: m, engines: [{url: 'http://a:1'}]}]"), func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	if dm := d.Models[0]; d.Listen != ":8080" || d.BodyLimit != DefaultBodyLimit || dm.Policy != "kv" || dm.Tokenizer != "render" || dm.Retries != 1 ||
		dm.Timeouts.FirstByte != 5*time.Minute || dm.ShadowServe != "round_robin" {
		t.Errorf("defaults: %+v %+v", d, dm)
	}
}

func TestParseConfigErrors(t *testing.T) {
	tests := []struct {
		name, src string
		want      []string
	}{
		{"unknown field names field and line", "listen: x\nmodels:\n  - name: m\n    polcy: kv\n", []string{`models[0].polcy (line 4): unknown field "polcy"`}},
		{"wrong type", "body_limit: lots\n", []string{"body_limit (line 1): cannot unmarshal !!str `lots` into int64"}},
		{"sequence for a string names the field", "listen: [1,2]\n", []string{"listen (line 1): cannot unmarshal !!seq into string"}},
		{"block sequence for a string", "models:\n  - name: m\n    tokenizer:\n      - a\n", []string{"models[0].tokenizer (line 4): cannot unmarshal !!seq into string"}},
		{"map for an int, same line as a scalar", "models: [{name: m, retries: {a: 1}}]\n", []string{"models[0].retries (line 1): cannot unmarshal !!map into int"}},
		{"nested sequence for a string", modelWith("tokenizer: [[a]]"), []string{"models[0].tokenizer (line 3): cannot unmarshal !!seq into string"}},
		{"wrong element type", "models:\n  - name: m\n    session_headers: [x, [y]]\n", []string{"models[0].session_headers[1] (line 3): cannot unmarshal !!seq into string"}},
		{"bad duration", "drain_timeout: soon\n", []string{"drain_timeout (line 1): cannot unmarshal !!str `soon` into time.Duration"}},
		{"empty file", "", []string{"empty"}},
		{"no models", "listen: ':1'\n", []string{"models (line 1): at least one model"}},
		{"bad engine url with line", "models:\n  - name: m\n    engines:\n      - url: ftp://x\n", []string{"models[0].engines[0].url (line 4)", "want http(s)"}},
		{"unknown policy with line", "models:\n  - name: m\n    policy: fastest\n    engines: [{url: 'http://a:1'}]\n", []string{"models[0].policy (line 3)", `unknown policy "fastest"`}},
		{"bad events address", "models:\n  - name: m\n    engines:\n      - {url: 'http://a:1', events: '10.0.0.1:5557'}\n", []string{"models[0].engines[0].events (line 4)"}},
		{"duplicate model and engine", "models:\n  - name: m\n    engines: [{url: 'http://a:1'}]\n  - name: m\n    engines: [{url: 'http://a:1'}]\n",
			[]string{"models[1].name (line 4): duplicate model", "models[1].engines[0] (line 5): engine \"http://a:1\" already listed"}},
		{"missing name and engines", "models:\n  - policy: kv\n", []string{"models[0].name (line 2): required", "models[0].engines (line 2)"}},
		{"negative kv weight", modelWith("routing: {kv: {gpu_weight: -1}}"), []string{"models[0].routing.kv.gpu_weight (line 3): -1: must be a finite number >= 0"}},
		{"negative rates and weights", modelWith("routing:\n  prefill_rate: -5\n  decode_rate: 0\n  llmd: {prefix_weight: -3}\n  kv: {decode_weight: -0.5, waiting_penalty: -1s}"),
			[]string{"models[0].routing.prefill_rate (line 4): -5", "models[0].routing.llmd.prefix_weight (line 6)", "models[0].routing.kv.decode_weight (line 7)", "models[0].routing.kv.waiting_penalty (line 7)"}},
		{"sglang threshold out of range", modelWith("routing: {sglang: {cache_threshold: 1.5, balance_rel_threshold: 0.5}}"),
			[]string{"routing.sglang.cache_threshold (line 3): 1.5: must be in [0, 1]", "routing.sglang.balance_rel_threshold (line 3)"}},
		{"session fallback", modelWith("routing: {session_fallback: session}"), []string{"routing.session_fallback (line 3)"}},
		{"absurd index size", modelWith("index: {max_entries: 99999999999, approx_ttl: -1s}"),
			[]string{"models[0].index.max_entries (line 3): 99999999999: must be in 0..1073741824", "models[0].index.approx_ttl (line 3)"}},
		{"retries below -1", modelWith("retries: -5"), []string{"models[0].retries (line 3): -5: must be >= -1"}},
		{"adapters", modelWith("adapter_loading: eager\nadapters: [{name: m}, {path: /x}]"),
			[]string{`models[0].adapter_loading (line 3): "eager": want off or load`, `models[0].adapters[0].name (line 4): "m": already a model or adapter name`, "models[0].adapters[1].name (line 4): required"}},
		{"negative timeout", modelWith("timeouts: {idle: -1s}"), []string{"models[0].timeouts.idle (line 3): must not be negative"}},
		{"health numbers", "health: {probe_timeout: -1s, eject_after_server_errors: -2, backoff_base: 10s, backoff_max: 1s}\n" + modelWith(""),
			[]string{"health.probe_timeout (line 1)", "health.eject_after_server_errors (line 1)", "health.backoff_max (line 1): 1s is less than backoff_base 10s"}},
		{"panic threshold and probe timeouts", "health: {panic_threshold: 1.5, eject_after_probe_timeouts: -1}\n" + modelWith(""),
			[]string{"health.panic_threshold (line 1): 1.5: want a share in [0, 1]", "health.eject_after_probe_timeouts (line 1)"}},
		{"tls cert without key", "tls: {cert_file: /c.pem}\n" + modelWith(""), []string{"tls (line 1): cert_file and key_file go together"}},
		{"udp events", "models:\n  - name: m\n    engines:\n      - url: http://a:1\n        events: udp://x\n",
			[]string{`models[0].engines[0].events (line 5): "udp://x": unsupported transport "udp"`}},
		{"events without port", "models:\n  - name: m\n    engines:\n      - url: http://a:1\n        events: tcp://x\n", []string{"models[0].engines[0].events (line 5)", "want tcp://host:port"}},
		{"events bind wildcard", "models:\n  - name: m\n    engines:\n      - url: http://a:1\n        events: 'tcp://*:5557'\n", []string{"models[0].engines[0].events (line 5)", "not a bind wildcard"}},
		{"bad replay port", "models:\n  - name: m\n    engines:\n      - url: http://a:1\n        events: tcp://x:1\n        replay: tcp://x:70000\n", []string{"models[0].engines[0].replay (line 6)", "1..65535"}},
		{"replay ports overlap the events ports", "models:\n  - name: m\n    engines:\n      - url: http://a:1\n        events: tcp://x:5557\n        replay: tcp://x:5558\n        dp_size: 2\n", []string{"models[0].engines[0].replay (line 6)", "overlap the events ports 5557..5558"}},
		{"events_bind and replay on one port", "models:\n  - name: m\n    engines:\n      - url: http://a:1\n        events: tcp://127.0.0.1:16557\n        events_bind: true\n        replay: tcp://localhost:16557\n", []string{"models[0].engines[0].replay (line 7)", "overlap"}},
		{"wildcard bind and replay on one port", "models:\n  - name: m\n    engines:\n      - url: http://a:1\n        events: tcp://*:5557\n        events_bind: true\n        replay: tcp://127.0.0.1:5557\n", []string{"models[0].engines[0].replay (line 7)", "overlap"}},
		{"one ipc path for both", "models:\n  - name: m\n    engines:\n      - url: http://a:1\n        events: ipc:///tmp/kv.sock\n        replay: ipc:///tmp/kv.sock\n", []string{"models[0].engines[0].replay (line 6)", "same ipc path"}},
		{"replay on the events port", "models:\n  - name: m\n    engines:\n      - url: http://a:1\n        events: tcp://x:5557\n        replay: tcp://x:5557\n", []string{"models[0].engines[0].replay (line 6)", "overlap"}},
		{"replay without events", "models:\n  - name: m\n    engines:\n      - url: http://a:1\n        replay: tcp://x:1\n", []string{"models[0].engines[0].replay (line 5): replay without events"}},
		{"dp ranks past the last port", "models:\n  - name: m\n    engines:\n      - {url: 'http://a:1', events: 'tcp://x:65535', dp_size: 2}\n", []string{"dp_size 2 needs ports up to 65536"}},
		{"events_bind without events", "models:\n  - name: m\n    engines:\n      - url: http://a:1\n        events_bind: true\n", []string{"models[0].engines[0].events_bind (line 5): events_bind without events"}},
		{"events_bind without host", "models:\n  - name: m\n    engines:\n      - url: http://a:1\n        events_bind: true\n        events: 'tcp://:5557'\n", []string{"models[0].engines[0].events (line 6)", "to bind"}},
		{"events_bind type", "models:\n  - name: m\n    engines:\n      - {url: 'http://a:1', events: 'tcp://*:1', events_bind: maybe}\n", []string{"models[0].engines[0].events_bind (line 4): cannot unmarshal"}},
		{"two engines bind one address", "models:\n  - name: m\n    engines:\n      - {url: 'http://a:1', events: 'tcp://127.0.0.1:5557', events_bind: true}\n  - name: n\n    engines:\n      - url: http://b:1\n        events_bind: true\n        events: 'tcp://127.0.0.1:5557'\n",
			[]string{`models[1].engines[0].events (line 9): "tcp://127.0.0.1:5557": address already bound for models[0].engines[0].events`}},
		{"wildcard bind clashes with a host", "models:\n  - name: m\n    engines:\n      - {url: 'http://a:1', events: 'tcp://127.0.0.1:5558', events_bind: true}\n      - {url: 'http://b:1', events: 'tcp://*:5557', events_bind: true, dp_size: 2}\n",
			[]string{"models[0].engines[1].events (line 5)", "already bound for models[0].engines[0].events"}},
		{"ipc bound twice", "models:\n  - name: m\n    engines:\n      - {url: 'http://a:1', events: 'ipc:///tmp/e', events_bind: true}\n      - {url: 'http://b:1', events: 'ipc:///tmp/e', events_bind: true}\n",
			[]string{"models[0].engines[1].events (line 5)", "already bound"}},
		{"api_key_env names an unset variable", "models:\n  - name: m\n    engines:\n      - url: http://a:1\n        api_key: literal\n        api_key_env: VLLM_KEY_A\n",
			[]string{"models[0].engines[0].api_key_env (line 6): environment variable VLLM_KEY_A is not set"}},
		{"bad too_long", modelWith("too_long: truncate"), []string{`models[0].too_long (line 3): "truncate": want reject or forward`}},
		{"events_queue negative", "models:\n  - name: m\n    engines:\n      - {url: 'http://a:1', events: 'tcp://x:1', events_queue: -1}\n",
			[]string{"models[0].engines[0].events_queue (line 4): -1: must be in 1..1048576 (0: default 1024)"}},
		{"events_queue too large", "models:\n  - name: m\n    engines:\n      - url: http://a:1\n        events_queue: 2000000\n",
			[]string{"models[0].engines[0].events_queue (line 5): 2000000: must be in 1..1048576"}},
		{"events_queue type", "models:\n  - name: m\n    engines:\n      - {url: 'http://a:1', events_queue: big}\n",
			[]string{"models[0].engines[0].events_queue (line 4): cannot unmarshal"}},
		{"discovery type errors name the sub-field", "models:\n  - name: m\n    discovery:\n      namespace: x\n      service: vllm\n      resync: soon\n      defaults: {dp_size: two}\n",
			[]string{"models[0].discovery.resync (line 6): cannot unmarshal !!str `soon` into time.Duration",
				"models[0].discovery.defaults.dp_size (line 7): cannot unmarshal !!str `two` into int"}},
		{"discovery value errors name the sub-field", "models:\n  - name: m\n    discovery:\n      namespace: x\n      selector: 'a in ('\n      defaults:\n        dp_size: 5000\n        replay_port: 5600\n",
			[]string{"models[0].discovery.selector (line 5): \"a in (\"", "models[0].discovery.defaults.dp_size (line 7): 5000: want 1..1024",
				"models[0].discovery.defaults.replay_port (line 8): 5600 needs events_port"}},
		{"discovery without namespace", "models:\n  - name: m\n    discovery: {service: vllm}\n", []string{"models[0].discovery.namespace (line 3): required"}},
		{"bad mismatch reaction", "models:\n  - name: m\n    tokenizer_mismatch: panic\n    engines: [{url: 'http://a:1'}]\n", []string{"tokenizer_mismatch (line 3)"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := Parse([]byte(tt.src), func(string) string { return "" })
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

// modelWith returns a one-model config whose model has extra (YAML lines at
// the model's indentation, starting on line 3).
func modelWith(extra string) string {
	var b strings.Builder
	b.WriteString("models:\n  - name: m\n")
	for l := range strings.Lines(extra) {
		b.WriteString("    " + strings.TrimRight(l, "\n") + "\n")
	}
	b.WriteString("    engines: [{url: 'http://a:1'}]\n")
	return b.String()
}

func TestParseConfigAccepts(t *testing.T) {
	for _, src := range []string{
		modelWith("retries: -1"),
		modelWith("routing: {kv: {credit_decay: -1s}}\nindex: {predict_ttl: -1s}"), // documented: off
		modelWith("routing: {sglang: {cache_threshold: 1, balance_rel_threshold: 1}}"),
		"health: {probe_interval: -1s, scrape_interval: -1s}\n" + modelWith(""),
		"models:\n  - name: m\n    engines:\n      - {url: 'http://a:1', events: 'ipc:///tmp/ev', replay: 'tcp://[::1]:5558'}\n",
		// Bind mode: loopback or wildcard, distinct ports (dp ranks
		// included), the same port on two hosts, a topic.
		"models:\n  - name: m\n    engines:\n      - {url: 'http://a:1', events: 'tcp://127.0.0.1:5557', events_bind: true, dp_size: 2, replay: 'tcp://a:5558', topic: kv}\n" +
			"      - {url: 'http://b:1', events: 'tcp://*:5559', events_bind: true}\n      - {url: 'http://c:1', events: 'tcp://10.0.0.1:5557', events_bind: true}\n" +
			"      - {url: 'http://d:1', events: 'tcp://d:5557'}\n",
	} {
		if _, _, err := Parse([]byte(src), func(string) string { return "" }); err != nil {
			t.Errorf("%s: %v", src, err)
		}
	}
}

// TestParseConfigEventsBind: events_bind and topic reach EngineConfig.
func TestParseConfigEventsBind(t *testing.T) {
	src := "models:\n  - name: m\n    engines:\n      - {url: 'http://a:1', events: 'tcp://127.0.0.1:5557', events_bind: true, topic: kv, replay: 'tcp://127.0.0.1:5558'}\n"
	cfg, _, err := Parse([]byte(src), func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	e := cfg.Models[0].Engines[0]
	if !e.EventsBind || e.Topic != "kv" || e.Events != "tcp://127.0.0.1:5557" || e.Replay != "tcp://127.0.0.1:5558" {
		t.Fatalf("engine %+v", e)
	}
}
