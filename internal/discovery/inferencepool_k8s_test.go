package discovery

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"

	"kvrouter/internal/config"
)

// installPoolCRD installs the upstream InferencePool CRD (the module's
// config/crd/bases manifest, read from the module cache) and waits until
// the API serves the resource in ns.
func installPoolCRD(t *testing.T, e *env, dyn dynamic.Interface) {
	t.Helper()
	out, err := exec.CommandContext(e.ctx, "go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/gateway-api-inference-extension").Output()
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
	if _, err := dyn.Resource(crds).Create(e.ctx, &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating the InferencePool CRD: %v", err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := dyn.Resource(InferencePoolResource).Namespace(e.ns).List(e.ctx, metav1.ListOptions{}); err == nil {
			return
		} else if time.Now().After(deadline) {
			t.Fatalf("InferencePool API not served: %v", err)
		}
	}
}

// testPoolTargetPorts: an InferencePool with several target ports makes
// each Pod and port an engine (POD-rank-I on podIP:port), its KV event
// and replay ports offset by I*dp_size; back to one port, the Pod is one
// engine under its own name again.
func testPoolTargetPorts(t *testing.T, e *env) {
	dyn := dynamic.NewForConfigOrDie(e.c.Config())
	installPoolCRD(t, e, dyn)
	pools := dyn.Resource(InferencePoolResource).Namespace(e.ns)
	setPool := func(ports ...int64) {
		t.Helper()
		var tp []any
		for _, p := range ports {
			tp = append(tp, map[string]any{"number": p})
		}
		obj := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
			"metadata": map[string]any{"name": "llm", "namespace": e.ns},
			"spec": map[string]any{
				"selector":          map[string]any{"matchLabels": map[string]any{"app": "vllm"}},
				"targetPorts":       tp,
				"endpointPickerRef": map[string]any{"name": "kvrouter", "port": map[string]any{"number": int64(9002)}},
			},
		}}
		cur, err := pools.Get(e.ctx, "llm", metav1.GetOptions{})
		if err == nil {
			obj.SetResourceVersion(cur.GetResourceVersion())
			_, err = pools.Update(e.ctx, obj, metav1.UpdateOptions{})
		} else {
			_, err = pools.Create(e.ctx, obj, metav1.CreateOptions{})
		}
		if err != nil {
			t.Fatalf("writing the InferencePool: %v", err)
		}
	}
	r := start(t, e.c.Config(), config.Discovery{Namespace: e.ns, InferencePool: "llm", Defaults: config.EngineSettings{EventsPort: 5557, ReplayPort: 5600}})
	e.pod(t, "a", "192.0.2.1", map[string]string{"app": "vllm"}, nil, true)
	e.pod(t, "b", "192.0.2.2", map[string]string{"app": "vllm"}, map[string]string{AnnotationDPSize: "2"}, true)
	setPool(8000, 8001, 8002)
	s := r.waitAddrs(t, "192.0.2.1:8000=ready", "192.0.2.1:8001=ready", "192.0.2.1:8002=ready",
		"192.0.2.2:8000=ready", "192.0.2.2:8001=ready", "192.0.2.2:8002=ready")
	want := map[string]Engine{
		"192.0.2.1:8000": {Name: "a-rank-0", Settings: config.EngineSettings{EventsPort: 5557, ReplayPort: 5600, DPSize: 1}},
		"192.0.2.1:8001": {Name: "a-rank-1", Settings: config.EngineSettings{EventsPort: 5558, ReplayPort: 5601, DPSize: 1}},
		"192.0.2.1:8002": {Name: "a-rank-2", Settings: config.EngineSettings{EventsPort: 5559, ReplayPort: 5602, DPSize: 1}},
		// dp_size 2: server i holds ranks 2i and 2i+1.
		"192.0.2.2:8000": {Name: "b-rank-0", Settings: config.EngineSettings{EventsPort: 5557, ReplayPort: 5600, DPSize: 2}},
		"192.0.2.2:8001": {Name: "b-rank-1", Settings: config.EngineSettings{EventsPort: 5559, ReplayPort: 5602, DPSize: 2}},
		"192.0.2.2:8002": {Name: "b-rank-2", Settings: config.EngineSettings{EventsPort: 5561, ReplayPort: 5604, DPSize: 2}},
	}
	for _, got := range s.Engines {
		w := want[got.Addr]
		if got.Name != w.Name || got.Settings != w.Settings {
			t.Errorf("%s: %s %+v, want %s %+v", got.Addr, got.Name, got.Settings, w.Name, w.Settings)
		}
	}
	setPool(8001)
	s = r.waitAddrs(t, "192.0.2.1:8001=ready", "192.0.2.2:8001=ready")
	want = map[string]Engine{
		"192.0.2.1:8001": {Name: "a", Settings: config.EngineSettings{EventsPort: 5557, ReplayPort: 5600, DPSize: 1}},
		"192.0.2.2:8001": {Name: "b", Settings: config.EngineSettings{EventsPort: 5557, ReplayPort: 5600, DPSize: 2}},
	}
	for _, got := range s.Engines {
		if w := want[got.Addr]; got.Name != w.Name || got.Settings != w.Settings {
			t.Errorf("one target port: %s: %s %+v, want %s %+v", got.Addr, got.Name, got.Settings, w.Name, w.Settings)
		}
	}
}
