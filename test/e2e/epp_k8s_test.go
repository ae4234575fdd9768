package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"kvrouter/internal/discovery"
	"kvrouter/internal/k8stest"
)

// installInferencePoolCRD installs the upstream InferencePool CRD (the
// module's config/crd/bases manifest, read from the module cache, not
// copied) and waits until the API serves the resource.
func installInferencePoolCRD(t *testing.T, dyn dynamic.Interface, ns string) {
	t.Helper()
	out, err := exec.CommandContext(t.Context(), "go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/gateway-api-inference-extension").Output()
	if err != nil {
		t.Fatalf("locating the inference extension module: %v", err)
	}
	data, err := os.ReadFile(filepath.Join(strings.TrimSpace(string(out)), "config/crd/bases/inference.networking.k8s.io_inferencepools.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var obj map[string]any
	if err := yaml.Unmarshal(data, &obj); err != nil {
		t.Fatal(err)
	}
	crds := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	if _, err := dyn.Resource(crds).Create(t.Context(), &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating the InferencePool CRD: %v", err)
	}
	e2eEventually(t, 30*time.Second, "InferencePool API served", func() bool {
		_, err := dyn.Resource(discovery.InferencePoolResource).Namespace(ns).List(t.Context(), metav1.ListOptions{})
		return err == nil
	})
}

// TestEPPInferencePool runs kvrouter epp with its engines from an
// InferencePool in a real kube-apiserver, in front of engine-sims in
// network namespaces (Pods whose status the test sets as a kubelet
// would): a change of the pool's selector or of a Pod's readiness reaches
// the picks within 1 s.
func TestEPPInferencePool(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts a kube-apiserver")
	}
	c := k8stest.Start(t, k8stest.Options{})
	ctx := t.Context()
	const ns = "epp"
	if err := c.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	cs := kubernetes.NewForConfigOrDie(c.Config())
	dyn := dynamic.NewForConfigOrDie(c.Config())
	installInferencePoolCRD(t, dyn, ns)
	rc := c.Config()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	kc := fmt.Sprintf("apiVersion: v1\nkind: Config\nclusters: [{name: t, cluster: {server: %q, certificate-authority: %q}}]\n"+
		"users: [{name: a, user: {token: %q}}]\ncontexts: [{name: t, context: {cluster: t, user: a}}]\ncurrent-context: t\n",
		rc.Host, rc.CAFile, rc.BearerToken)
	if err := os.WriteFile(kubeconfig, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	a, b := k8sEngine(t), k8sEngine(t)
	pod := func(name, ip, role string, ready bool) {
		t.Helper()
		p, err := cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			p, err = cs.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": "vllm", "role": role}},
				Spec:       corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai"}}},
			}, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
		}
		st := corev1.ConditionFalse
		if ready {
			st = corev1.ConditionTrue
		}
		p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: st, LastTransitionTime: metav1.Now()}}}
		if _, err := cs.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	pools := dyn.Resource(discovery.InferencePoolResource).Namespace(ns)
	setPool := func(match map[string]any) time.Time {
		t.Helper()
		obj := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
			"metadata": map[string]any{"name": "llm", "namespace": ns},
			"spec": map[string]any{
				"selector":          map[string]any{"matchLabels": match},
				"targetPorts":       []any{map[string]any{"number": int64(8000)}},
				"endpointPickerRef": map[string]any{"name": "kvrouter-epp", "port": map[string]any{"number": int64(9002)}},
			},
		}}
		at := time.Now()
		cur, err := pools.Get(ctx, "llm", metav1.GetOptions{})
		if err == nil {
			obj.SetResourceVersion(cur.GetResourceVersion())
			_, err = pools.Update(ctx, obj, metav1.UpdateOptions{})
		} else {
			_, err = pools.Create(ctx, obj, metav1.CreateOptions{})
		}
		if err != nil {
			t.Fatalf("writing the InferencePool: %v", err)
		}
		return at
	}
	pod("pod-a", a, "decode", true)
	pod("pod-b", b, "prefill", true)
	setPool(map[string]any{"app": "vllm", "role": "decode"})

	s := startEPP(t, fmt.Sprintf(`health: {probe_interval: 200ms, scrape_interval: 200ms}
models:
  - name: m
    tokenizer: none
    policy: round_robin
    discovery: {namespace: %s, inference_pool: llm, kubeconfig: %q}
`, ns, kubeconfig), 0)
	s.waitReady(t)

	picks := func(n int) map[string]int {
		seen := map[string]int{}
		for range n {
			r := s.envoy.do(ctx, envoyReq{path: "/v1/completions", body: []byte(`{"model":"m","prompt":[1,2,3,4],"max_tokens":2}`)})
			if r.immediate != nil {
				seen[fmt.Sprint(int(r.immediate.GetStatus().GetCode()))]++
				continue
			}
			seen[strings.Split(r.dest, ",")[0]]++
		}
		return seen
	}
	addrA, addrB := a+":8000", b+":8000"
	waitPicked := func(what string, since time.Time, want ...string) time.Duration {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			got := picks(2 * len(want))
			ok := len(got) == len(want)
			for _, w := range want {
				ok = ok && got[w] > 0
			}
			if ok {
				return time.Since(since)
			}
		}
		t.Fatalf("%s: picks %v, want %v", what, picks(4), want)
		return 0
	}
	waitPicked("pool selects pod-a", time.Now(), addrA)
	d := waitPicked("pool selects both", setPool(map[string]any{"app": "vllm"}), addrA, addrB)
	at := time.Now()
	pod("pod-a", a, "decode", false)
	d = max(d, waitPicked("pod-a not ready", at, addrB))
	at = time.Now()
	pod("pod-a", a, "decode", true)
	d = max(d, waitPicked("pod-a ready again", at, addrA, addrB))
	d = max(d, waitPicked("pool selects prefill only", setPool(map[string]any{"app": "vllm", "role": "prefill"}), addrB))
	// pod-a left the pool: its series on both fronts go (the EPP's too,
	// its requests all ended).
	e2eEventually(t, 10*time.Second, "no series of pod-a once it left the pool", func() bool {
		return !strings.Contains(e2eMetricsText(t, s.url), `replica="pod-a"`)
	})
	t.Logf("InferencePool or Pod change to picks: at most %v (polling every 10 ms)", d)
	if d > time.Second {
		t.Errorf("a pool change took %v to reach routing, goal 1 s", d)
	}
	if err := pools.Delete(ctx, "llm", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e2eEventually(t, 20*time.Second, "no engine once the pool is deleted: 503", func() bool {
		return picks(1)["503"] == 1
	})
}
