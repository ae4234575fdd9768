package config

import (
	"strings"
	"testing"
)

func TestAliasConfigErrors(t *testing.T) {
	_, _, err := Parse([]byte(modelWith("aliases:\n  - {name: m}\n  - {max_tokens: 10, max_tokens_cap: 5, thinking_token_budget: -1}")), func(string) string { return "" })
	for _, want := range []string{`models[0].aliases[0].name (line 4): "m": already`, "models[0].aliases[1].name (line 5): required",
		"models[0].aliases[1] (line 5): max_tokens 10, max_tokens_cap 5", "models[0].aliases[1].thinking_token_budget (line 5)"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v, want it to contain %q", err, want)
		}
	}
}

// TestPeersConfig: pod_name and namespace come from POD_NAME and
// POD_NAMESPACE; a peers block with routers set by hand, or without a
// selector, is refused naming each.
func TestPeersConfig(t *testing.T) {
	env := map[string]string{"POD_NAME": "kvrouter-7d9-x2", "POD_NAMESPACE": "serving"}
	getenv := func(k string) string { return env[k] }
	cfg, _, err := Parse([]byte("peers:\n  selector: app.kubernetes.io/name=kvrouter\n"+modelWith("")), getenv)
	if err != nil {
		t.Fatal(err)
	}
	if p := cfg.Peers; p.PodName != "kvrouter-7d9-x2" || p.Namespace != "serving" || p.Selector != "app.kubernetes.io/name=kvrouter" {
		t.Errorf("peers = %+v", *p)
	}
	_, _, err = Parse([]byte("peers: {pod_name: x}\n"+modelWith("routing: {routers: 2, router_index: 1}")), getenv)
	for _, want := range []string{"models[0] (m): routing.routers and router_index are set by peers", "peers: discovery: peers: selector: required"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not say %q", err, want)
		}
	}
}
