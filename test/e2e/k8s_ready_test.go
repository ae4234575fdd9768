package e2e

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"

	"kvrouter/internal/k8stest"
)

// TestServeKubernetesReadyLabels: serve with a group discovered from a real
// kube-apiserver whose engine, an engine-sim process in a network namespace
// (a Pod's address), publishes KV events on the events port the discovery
// defaults name. GET /ready must say what the router does: the exact index,
// the engine's event stream connected, and the engine ready only once it is;
// router.yaml lists no engine to read that from.
func TestServeKubernetesReadyLabels(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts a kube-apiserver")
	}
	c := k8stest.Start(t, k8stest.Options{})
	ctx := t.Context()
	const ns = "ready"
	if err := c.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(c.Config())
	if err != nil {
		t.Fatal(err)
	}
	bin := e2eBuild(t)
	n := k8stest.NewNetNS(t)
	const events, replay = 5557, 5558
	logs := &lockedBuffer{}
	cmd := n.Command(ctx, bin, "engine-sim", "--host", n.Addr.String(), "--port", "8000", "--served-model-name", "m",
		"--profile", "fast", "--num-gpu-blocks-override", "1024", "--max-model-len", "4096",
		"--kv-events-config", kvEventsConfig("*", events, replay, ""))
	cmd.Stderr = logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("engine-sim log:\n%s", logs.String())
		}
	})
	engine := "http://" + n.Addr.String() + ":8000"
	e2eEventually(t, 20*time.Second, "engine-sim in its namespace healthy", func() bool {
		resp, err := http.Get(engine + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	writeSlice(t, cs, ns, "vllm-a", k8sEndpoint(n.Addr.String(), true, true, false))
	pod := "pod-" + strings.ReplaceAll(n.Addr.String(), ".", "-")

	r := serveYAML(t, fmt.Sprintf(`health: {probe_interval: 200ms, scrape_interval: 200ms}
models:
  - name: m
    tokenizer: none
    discovery: {namespace: %s, service: vllm, kubeconfig: %q, defaults: {events_port: %d, replay_port: %d}}
`, ns, kubeconfigFile(t, c), events, replay), 0)

	var last string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		code, st := r.ready("")
		up, ev := false, ""
		if len(st.Models) == 1 {
			up, ev = st.engine(pod)
		}
		last = strconv.Itoa(code) + fmt.Sprintf(" %+v", st)
		if code == 200 && up && ev == "connected" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/ready not 200 with %s's event stream connected in 30 s; last: %s", pod, last)
		}
	}
	t.Logf("/ready: %s", last)
	resp, err := r.client.Get(r.url + "/ready")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if body := string(b); resp.StatusCode != 200 || !strings.Contains(body, `"index":"exact"`) || !strings.Contains(body, `"events":"connected"`) {
		t.Fatalf("/ready %d %s; want the exact index and the engine's events connected", resp.StatusCode, body)
	}
	// Events flow: a request's blocks reach the exact index through them.
	if resp, out := r.post("/v1/completions", `{"model":"m","prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,32,33],"max_tokens":2}`); resp.StatusCode != 200 {
		t.Fatalf("completion: %d %s", resp.StatusCode, out)
	}
	e2eEventually(t, 10*time.Second, "the engine's blocks in the exact index", func() bool {
		return e2eMetric(t, r.url, "kvrouter_kvindex_entries", `index="exact"`) > 0
	})
}
