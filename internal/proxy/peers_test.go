package proxy

import (
	"strings"
	"testing"
)

// TestPeersConfig: pod_name and namespace come from POD_NAME and
// POD_NAMESPACE; a peers block with routers set by hand, or without a
// selector, is refused naming each.
func TestPeersConfig(t *testing.T) {
	env := map[string]string{"POD_NAME": "kvrouter-7d9-x2", "POD_NAMESPACE": "serving"}
	getenv := func(k string) string { return env[k] }
	cfg, _, err := ParseConfig([]byte("peers:\n  selector: app.kubernetes.io/name=kvrouter\n"+modelWith("")), getenv)
	if err != nil {
		t.Fatal(err)
	}
	if p := cfg.Peers; p.PodName != "kvrouter-7d9-x2" || p.Namespace != "serving" || p.Selector != "app.kubernetes.io/name=kvrouter" {
		t.Errorf("peers = %+v", *p)
	}
	_, _, err = ParseConfig([]byte("peers: {pod_name: x}\n"+modelWith("routing: {routers: 2, router_index: 1}")), getenv)
	for _, want := range []string{"models[0] (m): routing.routers and router_index are set by peers", "peers: discovery: peers: selector: required"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not say %q", err, want)
		}
	}
}
