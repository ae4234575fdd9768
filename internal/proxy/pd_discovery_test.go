package proxy

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"kvrouter/internal/config"
)

// TestPDDiscoveredRoles: a discovered group has a P/D set-up whose roles
// come from SetRoles; it is served in P/D only while one engine is a
// prefill engine; pd with roles off is refused; SetRoles refuses groups
// with static roles or none.
func TestPDDiscoveredRoles(t *testing.T) {
	disc := func(label string) config.Model {
		return config.Model{Name: "m", Discovery: &config.Discovery{Namespace: "ns", Selector: "app=vllm", RoleLabel: label}}
	}
	g := newPDGroup(disc(""))
	if g == nil || !g.discovered || g.active() {
		t.Fatalf("discovered group: %+v (active %v), want P/D set-up, inactive without roles", g, g != nil && g.active())
	}
	if newPDGroup(disc(config.RoleLabelOff)) != nil {
		t.Error("roles off: a P/D set-up")
	}
	s := &Server{models: map[string]*model{"m": {pd: g}, "static": {pd: newPDGroup(config.Model{Name: "static",
		Engines: []config.Engine{{Name: "p", Role: config.RolePrefill}, {Name: "d", Role: config.RoleDecode}}})}, "plain": {}}}
	if !s.SetRoles("m", map[string]string{"a": config.RoleDecode, "b": config.RoleDecode}) || g.active() {
		t.Error("decode engines only: active")
	}
	if !s.SetRoles("m", map[string]string{"a": config.RolePrefill, "b": config.RoleDecode, "c": "bogus"}) || !g.active() || !g.isPrefill("a") || !g.isDecode("b") || g.role("c") != "" {
		t.Errorf("after SetRoles: active %v, a %q, b %q, c %q", g.active(), g.role("a"), g.role("b"), g.role("c"))
	}
	if s.SetRoles("static", map[string]string{"p": config.RoleDecode}) || !s.models["static"].pd.isPrefill("p") {
		t.Error("SetRoles changed a group with roles from router.yaml")
	}
	if s.SetRoles("plain", nil) || s.SetRoles("nope", nil) {
		t.Error("SetRoles accepted a group without P/D")
	}
	c := config.Config{Models: []config.Model{disc(config.RoleLabelOff)}}
	c.Models[0].PD.Mode = "always"
	c.FillDefaults(func(string) string { return "" })
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "role_label is off") {
		t.Errorf("pd with roles off: %v", err)
	}
	c.Models[0].Discovery.RoleLabel = ""
	if err := c.Validate(); err != nil {
		t.Errorf("pd on a discovered group with roles: %v", err)
	}
}

// TestPDParallelSampling: a long prompt with n (or best_of) above 1 takes
// the local path even under mode always (one kv_transfer_params cannot
// hand over n samples): no prefill leg, 200 from a decode engine, the
// reason counted and explained; n 1 still goes remote.
func TestPDParallelSampling(t *testing.T) {
	rg := newPDRig(t, twoByTwo)
	for _, extra := range []string{`"n":2`, `"best_of":3,"n":1`} {
		body := strings.Replace(pdPrompt(1, 3000, 3, false), `"model":"m"`, `"model":"m",`+extra, 1)
		resp := rg.post(context.Background(), "/v1/completions", body)
		out := readAll(t, resp)
		if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Kvrouter-Path") != pathLocal || !strings.HasPrefix(resp.Header.Get("X-Kvrouter-Replica"), "d") {
			t.Fatalf("%s: %d %v %s", extra, resp.StatusCode, resp.Header, out)
		}
		resp = rg.post(context.Background(), "/v1/route", body)
		if out := readAll(t, resp); !strings.Contains(out, `"reason":"parallel_sampling"`) {
			t.Errorf("%s: explain %s", extra, out)
		}
	}
	if n := rg.engine("p0").requests.Load() + rg.engine("p1").requests.Load(); n != 0 {
		t.Fatalf("%d prefill legs sent for parallel sampling", n)
	}
	if got := rg.pdCount(pathLocal, reasonParallelSampling); got != 2 {
		t.Errorf("parallel_sampling counted %v times, want 2", got)
	}
	resp := rg.post(context.Background(), "/v1/completions", strings.Replace(pdPrompt(5000, 3000, 3, false), `"model":"m"`, `"model":"m","n":1`, 1))
	if readAll(t, resp); resp.Header.Get("X-Kvrouter-Path") != pathDisaggregated {
		t.Errorf("n 1: path %q, want disaggregated", resp.Header.Get("X-Kvrouter-Path"))
	}
	if !parallelSampling([]byte(`{"n":4}`)) || parallelSampling([]byte(`{"n":"x"}`)) || parallelSampling([]byte(`{}`)) {
		t.Error("parallelSampling")
	}
}
