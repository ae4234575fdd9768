package config

import (
	"slices"
	"strings"
	"testing"
)

// Which changes a reload applies and which it reports as needing a
// restart.
func TestCompareRestart(t *testing.T) {
	base := `listen: ":8080"
models:
  - name: m
    engines: [{name: a, url: "http://127.0.0.1:1"}]
  - name: n
    engines: [{name: b, url: "http://127.0.0.1:2", events: "tcp://127.0.0.1:3"}]
`
	parse := func(y string) Config {
		t.Helper()
		c, _, err := Parse([]byte(y), func(string) string { return "" })
		if err != nil {
			t.Fatalf("%v\n%s", err, y)
		}
		return c
	}
	running, exact := parse(base), map[string]bool{"m": false, "n": true}
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
			if got := strings.Join(Compare(running, parse(y), exact).Restart, "; "); got != tc.want {
				t.Errorf("Restart = %q, want %q", got, tc.want)
			}
		})
	}
}

// The groups whose engine lists a reload applies: static in both, by
// name, in the new file's order; a group that turns to discovery, or is
// new, is not among them.
func TestCompareGroups(t *testing.T) {
	parse := func(y string) Config {
		t.Helper()
		c, _, err := Parse([]byte(y), func(string) string { return "" })
		if err != nil {
			t.Fatalf("%v\n%s", err, y)
		}
		return c
	}
	running := parse(`models:
  - name: m
    engines: [{name: a, url: "http://127.0.0.1:1"}]
  - name: n
    engines: [{name: b, url: "http://127.0.0.1:2"}]
  - name: d
    engines: [{name: c, url: "http://127.0.0.1:3"}]
`)
	next := parse(`models:
  - name: new
    engines: [{name: x, url: "http://127.0.0.1:9"}]
  - name: d
    discovery: {namespace: ns, service: vllm}
  - name: n
    engines: [{name: b, url: "http://127.0.0.1:2"}, {name: e, url: "http://127.0.0.1:5"}]
  - name: m
    engines: [{name: a, url: "http://127.0.0.1:1"}]
`)
	d := Compare(running, next, nil)
	if want := []GroupPair{{Running: 1, Next: 2}, {Running: 0, Next: 3}}; !slices.Equal(d.Groups, want) {
		t.Errorf("Groups = %v, want %v", d.Groups, want)
	}
	if want := "models (model groups added or removed); models[1].discovery"; strings.Join(d.Restart, "; ") != want {
		t.Errorf("Restart = %q, want %q", strings.Join(d.Restart, "; "), want)
	}
}
