package e2e

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
	"k8s.io/client-go/dynamic"

	"kvrouter/internal/config"
	"kvrouter/internal/k8stest"
)

// TestHelmChart lints the chart, renders it with the default values and
// the production-stack example, checks that each rendered router.yaml is
// a valid kvrouter configuration, and applies them, the plain manifests
// of deploy/manifests and the engine example deploy/kubernetes/vllm-engines.yaml
// with `kubectl apply --dry-run=server` to a real
// kube-apiserver in RBAC mode; then runs discovery under the chart's own
// RBAC (testChartRBAC).
func TestHelmChart(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs helm and a kube-apiserver")
	}
	helm := k8stest.Helm(t)
	chart := filepath.Join("..", "..", "deploy", "helm", "kvrouter")
	run := func(name string, args ...string) []byte {
		t.Helper()
		out, err := exec.CommandContext(t.Context(), name, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
		return out
	}
	example := filepath.Join(chart, "examples", "production-stack.yaml")
	run(helm, "lint", "--strict", chart)
	run(helm, "lint", "--strict", chart, "-f", example)
	eppExample := filepath.Join(chart, "examples", "epp.yaml")
	run(helm, "lint", "--strict", chart, "-f", eppExample)
	rendered := map[string][]byte{
		"default": run(helm, "template", "kvr", chart, "-n", "vllm"),
		"example": run(helm, "template", "kvr", chart, "-n", "vllm", "-f", example),
		// The optional index snapshot volume (docs/serve.md, Restarts).
		"snapshot": run(helm, "template", "kvr", chart, "-n", "vllm", "--set", "snapshot.enabled=true"),
		"epp":      run(helm, "template", "kvr", chart, "-n", "vllm", "-f", eppExample),
		// The admin listener on its own port and Service (TestHelmChartAdminPort).
		"admin": run(helm, "template", "kvr", chart, "-n", "vllm", "--set", "admin.port=9090"),
	}
	if out := string(rendered["epp"]); !strings.Contains(out, "kind: InferencePool") || !strings.Contains(out, "- epp\n") ||
		!strings.Contains(out, "service: readiness") || !strings.Contains(out, "inferencepools") {
		t.Errorf("epp example: no InferencePool, epp args, gRPC readiness probe or InferencePool RBAC:\n%s", out)
	}
	chartEPPRef(t, rendered["epp"])
	// kvrouter epp accepts the rendered arguments: cmd/kvrouter's TestHelmChartEPPArgs.
	chartEPPDocs(t, run(helm, "template", "kvrouter", chart, "-n", "vllm", "-f", eppExample))
	// The pool goes in the engines' namespace and its endpointPickerRef
	// has no namespace: a release elsewhere is refused.
	if out, err := exec.CommandContext(t.Context(), helm, "template", "kvr", chart, "-n", "vllm", "-f", eppExample, "--set", "rbac.namespace=other").CombinedOutput(); err == nil ||
		!strings.Contains(string(out), "endpointPickerRef can only name a Service there") {
		t.Errorf("epp example with the engines in another namespace: %v, want the chart to refuse it:\n%s", err, out)
	}
	for name, out := range rendered {
		kinds := map[string]int{}
		dec := yaml.NewDecoder(bytes.NewReader(out))
		for {
			var doc struct {
				Kind string            `yaml:"kind"`
				Data map[string]string `yaml:"data"`
			}
			if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			kinds[doc.Kind]++
			if doc.Kind == "ConfigMap" {
				cfg, _, err := config.Parse([]byte(doc.Data["router.yaml"]), podEnv)
				if err != nil {
					t.Errorf("%s: router.yaml rendered by the chart: %v\n%s", name, err, doc.Data["router.yaml"])
				}
				if want := name == "snapshot"; (cfg.Snapshot.Path == "/var/lib/kvrouter/index.snap") != want {
					t.Errorf("%s: snapshot path %q", name, cfg.Snapshot.Path)
				}
			}
		}
		for _, k := range []string{"Deployment", "Service", "ServiceAccount", "Role", "RoleBinding", "ConfigMap", "PodDisruptionBudget", "NetworkPolicy"} {
			if want := 1 + btoi(name == "admin" && k == "Service"); kinds[k] != want {
				t.Errorf("%s: %d %s, want %d (%v)", name, kinds[k], k, want, kinds)
			}
		}
	}

	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		if os.Getenv("KVROUTER_K8S_REQUIRED") == "1" {
			t.Fatal("kubectl not found (Debian kubernetes-client)")
		}
		t.Skip("kubectl not found")
	}
	c := k8stest.Start(t, k8stest.Options{RBAC: true})
	for _, ns := range []string{"vllm", "default"} {
		if err := c.CreateNamespace(t.Context(), ns); err != nil {
			t.Fatal(err)
		}
	}
	installInferencePoolCRD(t, dynamic.NewForConfigOrDie(c.Config()), "vllm")
	rc := c.Config()
	files := map[string]string{}
	for name, out := range rendered {
		f := filepath.Join(t.TempDir(), name+".yaml")
		if err := os.WriteFile(f, out, 0o600); err != nil {
			t.Fatal(err)
		}
		files[name] = f
	}
	// The plain manifests (TestManifests checks they are the chart's).
	manifests, _ := filepath.Glob(filepath.Join(manifestsDir, "*.yaml"))
	if len(manifests) == 0 {
		t.Fatal("no manifests in deploy/manifests")
	}
	for _, f := range manifests {
		files["manifests/"+filepath.Base(f)] = f
	}
	// The engine example (vLLM Pods that drain; docs/kubernetes.md).
	files["kubernetes/vllm-engines.yaml"] = filepath.Join("..", "..", "deploy", "kubernetes", "vllm-engines.yaml")
	for name, f := range files {
		got := run(kubectl, "--server", rc.Host, "--token", rc.BearerToken, "--certificate-authority", rc.CAFile,
			"apply", "--dry-run=server", "-f", f)
		if !regexp.MustCompile(`deployment.apps/\S+ created \(server dry run\)`).Match(got) {
			t.Errorf("%s: kubectl apply --dry-run=server:\n%s", name, got)
		}
	}
	t.Run("RBAC", func(t *testing.T) { testChartRBAC(t, c, helm, chart) })
}

// chartEPPRef checks that the rendered InferencePool's endpointPickerRef
// names the rendered Service, in its namespace, on its h2c gRPC port.
func chartEPPRef(t *testing.T, out []byte) {
	t.Helper()
	type meta struct{ Name, Namespace string }
	var pool struct {
		Metadata meta
		Spec     struct {
			EndpointPickerRef struct {
				Kind, Name string
				Port       struct{ Number int }
			} `yaml:"endpointPickerRef"`
		}
	}
	var svc struct {
		Metadata meta
		Spec     struct {
			Ports []struct {
				Name        string
				Port        int
				AppProtocol string `yaml:"appProtocol"`
			}
		}
	}
	dec := yaml.NewDecoder(bytes.NewReader(out))
	for {
		var node yaml.Node
		if err := dec.Decode(&node); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		var k struct{ Kind string }
		if err := node.Decode(&k); err != nil {
			t.Fatal(err)
		}
		switch k.Kind {
		case "InferencePool":
			if err := node.Decode(&pool); err != nil {
				t.Fatal(err)
			}
		case "Service":
			if err := node.Decode(&svc); err != nil {
				t.Fatal(err)
			}
		}
	}
	ref := pool.Spec.EndpointPickerRef
	ok := ref.Kind == "Service" && ref.Name == svc.Metadata.Name && pool.Metadata.Namespace == svc.Metadata.Namespace && ref.Port.Number != 0
	h2c := false
	for _, p := range svc.Spec.Ports {
		h2c = h2c || p.Port == ref.Port.Number && p.Name == "grpc" && p.AppProtocol == "kubernetes.io/h2c"
	}
	if !ok || !h2c {
		t.Errorf("InferencePool %+v endpointPickerRef %+v does not name Service %+v (ports %+v) on its h2c grpc port", pool.Metadata, ref, svc.Metadata, svc.Spec.Ports)
	}
}

// chartEPPDocs checks that docs/epp.md's Service and InferencePool
// manifests are what `helm install kvrouter -n vllm -f examples/epp.yaml`
// renders: names, namespaces, the pool's spec, the Service's ports.
func chartEPPDocs(t *testing.T, out []byte) {
	t.Helper()
	doc, err := os.ReadFile("../../docs/epp.md")
	if err != nil {
		t.Fatal(err)
	}
	objects := func(src []byte) map[string]map[string]any {
		m := map[string]map[string]any{}
		dec := yaml.NewDecoder(bytes.NewReader(src))
		for {
			var o map[string]any
			if err := dec.Decode(&o); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("%v\n%s", err, src)
			}
			if k, _ := o["kind"].(string); k == "Service" || k == "InferencePool" {
				m[k] = o
			}
		}
		return m
	}
	docs := map[string]map[string]any{}
	for _, block := range regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllSubmatch(doc, -1) {
		for k, o := range objects(block[1]) {
			docs[k] = o
		}
	}
	chart := objects(out)
	meta := func(o map[string]any) string {
		m, _ := o["metadata"].(map[string]any)
		return fmt.Sprint(m["name"], "/", m["namespace"])
	}
	ports := func(o map[string]any) string {
		var b strings.Builder
		spec, _ := o["spec"].(map[string]any)
		ps, _ := spec["ports"].([]any)
		for _, p := range ps {
			p, _ := p.(map[string]any)
			fmt.Fprintf(&b, "%v:%v:%v:%v ", p["name"], p["port"], p["targetPort"], p["appProtocol"])
		}
		return b.String()
	}
	for _, k := range []string{"Service", "InferencePool"} {
		d, c := docs[k], chart[k]
		if d == nil || c == nil {
			t.Errorf("%s: in docs/epp.md %v, rendered %v", k, d != nil, c != nil)
			continue
		}
		if meta(d) != meta(c) {
			t.Errorf("%s: docs/epp.md names %s, the chart renders %s", k, meta(d), meta(c))
		}
	}
	if d, c := docs["Service"], chart["Service"]; d != nil && c != nil && ports(d) != ports(c) {
		t.Errorf("Service ports: docs/epp.md %s, the chart %s", ports(d), ports(c))
	}
	if d, c := docs["InferencePool"], chart["InferencePool"]; d != nil && c != nil && !reflect.DeepEqual(d["spec"], c["spec"]) {
		t.Errorf("InferencePool spec: docs/epp.md %v, the chart %v", d["spec"], c["spec"])
	}
}
