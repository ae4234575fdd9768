package serve

import (
	"strings"
	"testing"

	"kvrouter/internal/proxy"
)

// Which changes a reload applies and which it reports as needing a
// restart.
func TestReloadRestartOnly(t *testing.T) {
	base := `listen: ":8080"
models:
  - name: m
    engines: [{name: a, url: "http://127.0.0.1:1"}]
  - name: n
    engines: [{name: b, url: "http://127.0.0.1:2", events: "tcp://127.0.0.1:3"}]
`
	parse := func(y string) proxy.Config {
		t.Helper()
		c, _, err := proxy.ParseConfig([]byte(y), func(string) string { return "" })
		if err != nil {
			t.Fatalf("%v\n%s", err, y)
		}
		return c
	}
	r := &reloader{running: parse(base), exact: map[string]bool{"m": false, "n": true}}
	for _, tc := range []struct {
		name, from, to string
		want           string
	}{
		{"same", "", "", ""},
		{"engines only", `engines: [{name: b, url: "http://127.0.0.1:2", events: "tcp://127.0.0.1:3"}]`, `engines: [{name: c, url: "http://127.0.0.1:4", events: "tcp://127.0.0.1:5", dp_size: 2}]`, ""},
		{"listen", `listen: ":8080"`, `listen: ":9090"`, "listen"},
		{"health", `listen: ":8080"`, "listen: \":8080\"\nhealth: {probe_interval: 1s}", "health"},
		{"drain_timeout", `listen: ":8080"`, "listen: \":8080\"\ndrain_timeout: 5s", "drain_timeout"},
		{"policy", "  - name: m\n", "  - name: m\n    policy: least_load\n", "models[0].policy"},
		{"timeouts", "  - name: m\n", "  - name: m\n    timeouts: {idle: 1s}\n", "models[0].timeouts"},
		{"model renamed", "name: n", "name: o", "models (model groups added or removed)"},
		{"events on an approximate group", `{name: a, url: "http://127.0.0.1:1"}`, `{name: a, url: "http://127.0.0.1:1", events: "tcp://127.0.0.1:6"}`,
			"models[0].engines[0].events (the group started without KV events: its index is approximate)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			y := strings.Replace(base, tc.from, tc.to, 1)
			if got := strings.Join(r.restartOnly(parse(y)), "; "); got != tc.want {
				t.Errorf("restartOnly = %q, want %q", got, tc.want)
			}
		})
	}
}
