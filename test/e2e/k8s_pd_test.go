package e2e

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kvrouter/internal/config"
	"kvrouter/internal/enginesim"
	"kvrouter/internal/k8stest"
)

// pdLegs sends one completion and returns its status and the headers that
// name its path, prefill engine and decode engine.
func (s *k8sScenario) pdLegs(n int) (code int, path, prefill, decode string) {
	prompt := make([]string, 64)
	for i := range prompt {
		prompt[i] = fmt.Sprint(5000 + n*64 + i)
	}
	resp, err := s.r.client.Post(s.r.url+"/v1/completions", "application/json",
		strings.NewReader(`{"model":"m","prompt":[`+strings.Join(prompt, ",")+`],"max_tokens":3}`))
	if err != nil {
		return 0, err.Error(), "", ""
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return 0, err.Error(), "", ""
	}
	h := resp.Header
	return resp.StatusCode, h.Get("X-Kvrouter-Path"), h.Get("X-Kvrouter-Prefill-Replica"), h.Get("X-Kvrouter-Replica")
}

// waitLegs polls until 6 requests in a row take path with prefill engine
// prefill (any decode engine of decode) and returns the time since since.
func (s *k8sScenario) waitLegs(what string, since time.Time, path, prefill string, decode ...string) time.Duration {
	s.t.Helper()
	var last string
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		ok := true
		for i := range 6 {
			code, p, pf, d := s.pdLegs(i)
			last = fmt.Sprintf("%d path=%q prefill=%q decode=%q", code, p, pf, d)
			if code != http.StatusOK || p != path || pf != prefill || !slicesContains(decode, d) {
				ok = false
				break
			}
		}
		if ok {
			return time.Since(since)
		}
	}
	s.t.Fatalf("%s: last request %s; want path %q, prefill %q, decode one of %v", what, last, path, prefill, decode)
	return 0
}

// relabel sets Pod name's role label to role ("" removes it).
func (s *k8sScenario) relabel(name, role string) time.Time {
	s.t.Helper()
	p, err := s.cs.CoreV1().Pods(s.ns).Get(s.t.Context(), name, metav1.GetOptions{})
	if err != nil {
		s.t.Fatal(err)
	}
	if role == "" {
		delete(p.Labels, config.DefaultRoleLabel)
	} else {
		p.Labels[config.DefaultRoleLabel] = role
	}
	at := time.Now()
	if _, err := s.cs.CoreV1().Pods(s.ns).Update(s.t.Context(), p, metav1.UpdateOptions{}); err != nil {
		s.t.Fatal(err)
	}
	return at
}

// TestServeKubernetesPDRoles: a model group discovered by Pod selector
// from a real kube-apiserver, its engine-sims in P/D roles (simulated
// NixlConnector) and its pools from the Pods' llm-d.ai/role label.
// Requests take the two legs over the discovered Pods (prefill on the
// prefill-labelled one, decode on the others); relabelling moves Pods
// between the pools; with no prefill Pod left the group serves whole
// requests; counters return to zero.
func TestServeKubernetesPDRoles(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts a kube-apiserver")
	}
	c := k8stest.Start(t, k8stest.Options{})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kube-apiserver log:\n%s", c.Log())
		}
	})
	s := newK8sScenario(t, c, "pd", 0)
	// kv_both on every engine (NixlConnector does not enforce kv_role):
	// the router's roles, from the labels, decide who prefills.
	for _, name := range []string{"e0", "e1", "e2"} {
		s.sims[name] = startCountedSimPD(t, enginesim.PDConfig{Role: enginesim.RoleBoth})
	}
	s.pod("e0", map[string]string{"app": "vllm", config.DefaultRoleLabel: "prefill"})
	s.pod("e1", map[string]string{"app": "vllm", config.DefaultRoleLabel: "decode"})
	s.pod("e2", map[string]string{"app": "vllm"}) // no label: a decode engine, as llm-d's decode filter takes it
	s.r = serveYAML(t, fmt.Sprintf(`health: {probe_interval: 200ms, scrape_interval: 200ms}
models:
  - name: m
    tokenizer: none
    policy: kv
    pd: {mode: always}
    discovery: {namespace: %s, kubeconfig: %q, selector: app=vllm}
`, s.ns, kubeconfigFile(t, c)), 0)

	s.waitLegs("e0 prefills", time.Now(), "disaggregated", "e0", "e1", "e2")
	before := s.sims["e0"].arrived.Load()
	for i := range 10 {
		if code, path, pf, d := s.pdLegs(100 + i); code != 200 || path != "disaggregated" || pf != "e0" || d == "e0" {
			t.Fatalf("request %d: %d path %q prefill %q decode %q", i, code, path, pf, d)
		}
	}
	if got := s.sims["e0"].arrived.Load() - before; got != 10 {
		t.Errorf("e0 (prefill) received %d requests for 10 prefill legs", got)
	}

	// e0 relabelled decode, e2 prefill: the pools swap.
	s.relabel("e0", "decode")
	at := s.relabel("e2", "prefill")
	d := s.waitLegs("e2 prefills", at, "disaggregated", "e2", "e0", "e1")
	t.Logf("Pod relabelled to routing change: %v", d.Round(time.Millisecond))
	if d > 2*time.Second {
		t.Errorf("a role relabel took %v to reach routing, goal 1 s (2 s allowed on the shared machine)", d)
	}

	// No prefill Pod left: whole requests on every engine.
	at = s.relabel("e2", "both")
	s.waitLegs("no prefill pod", at, "", "", "e0", "e1", "e2")
	s.settled(3)
	if n := e2eMetric(t, s.r.url, "kvrouter_proxy_pd_requests_total", `model="m"`, `path="disaggregated"`, `reason="always"`); n < 16 {
		t.Errorf("kvrouter_proxy_pd_requests_total{path=disaggregated} = %v, want the two-leg requests counted", n)
	}
}
