package proxy

import (
	"strings"
	"testing"
)

// TestBackendSetStripesSurvivesRebuild: the place SetStripes gives a
// group's router holds after the index and router are rebuilt for a new
// block size (a rebuild copies the group's routing config), and a bad
// place is refused without changing it.
func TestBackendSetStripesSurvivesRebuild(t *testing.T) {
	b, err := NewBackend(BackendConfig{Model: "m", Replicas: []string{"a", "b"}, Exact: true}, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.SetStripes(3, 2); err != nil {
		t.Fatal(err)
	}
	if err := b.SetStripes(2, 2); err == nil {
		t.Error("SetStripes(2, 2) accepted")
	}
	old := b.cur.Load()
	b.setBlockSize("a", 32, "test")
	g := b.cur.Load()
	if g == old || g.blockSize != 32 {
		t.Fatalf("no rebuild: block size %d", g.blockSize)
	}
	if n, i := g.router.Stripes(); n != 3 || i != 2 {
		t.Errorf("after the rebuild the router's place is %d, %d, want 3, 2", n, i)
	}
}

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
