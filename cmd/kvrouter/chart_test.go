package main

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
	"k8s.io/client-go/dynamic"

	"kvrouter/internal/k8stest"
	"kvrouter/internal/proxy"
)

// helmBin is helm as set-up builds it (KVROUTER_HELM), else on PATH; the
// test fails without it under KVROUTER_K8S_REQUIRED and skips otherwise.
func helmBin(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("KVROUTER_HELM"); p != "" {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if p, err := exec.LookPath("helm"); err == nil {
		return p
	}
	if os.Getenv("KVROUTER_K8S_REQUIRED") == "1" {
		t.Fatal("helm not found (KVROUTER_HELM or PATH): run make setup-test")
	}
	t.Skip("helm not found: make setup-test builds it")
	return ""
}

// TestHelmChart lints the chart, renders it with the default values and
// the production-stack example, checks that each rendered router.yaml is
// a valid kvrouter configuration, and applies the manifests with
// `kubectl apply --dry-run=server` to a real kube-apiserver.
func TestHelmChart(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs helm and a kube-apiserver")
	}
	helm := helmBin(t)
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
		"epp":     run(helm, "template", "kvr", chart, "-n", "vllm", "-f", eppExample),
	}
	if out := string(rendered["epp"]); !strings.Contains(out, "kind: InferencePool") || !strings.Contains(out, "- epp\n") ||
		!strings.Contains(out, "service: readiness") || !strings.Contains(out, "inferencepools") {
		t.Errorf("epp example: no InferencePool, epp args, gRPC readiness probe or InferencePool RBAC:\n%s", out)
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
				if _, _, err := proxy.ParseConfig([]byte(doc.Data["router.yaml"]), func(string) string { return "" }); err != nil {
					t.Errorf("%s: router.yaml rendered by the chart: %v\n%s", name, err, doc.Data["router.yaml"])
				}
			}
		}
		for _, k := range []string{"Deployment", "Service", "ServiceAccount", "Role", "RoleBinding", "ConfigMap", "PodDisruptionBudget", "NetworkPolicy"} {
			if kinds[k] != 1 {
				t.Errorf("%s: %d %s, want 1 (%v)", name, kinds[k], k, kinds)
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
	c := k8stest.Start(t, k8stest.Options{})
	if err := c.CreateNamespace(t.Context(), "vllm"); err != nil {
		t.Fatal(err)
	}
	installInferencePoolCRD(t, dynamic.NewForConfigOrDie(c.Config()), "vllm")
	rc := c.Config()
	for name, out := range rendered {
		f := filepath.Join(t.TempDir(), name+".yaml")
		if err := os.WriteFile(f, out, 0o600); err != nil {
			t.Fatal(err)
		}
		got := run(kubectl, "--server", rc.Host, "--token", rc.BearerToken, "--certificate-authority", rc.CAFile,
			"apply", "--dry-run=server", "-f", f)
		if !strings.Contains(string(got), "deployment.apps/kvr-kvrouter created (server dry run)") {
			t.Errorf("%s: kubectl apply --dry-run=server:\n%s", name, got)
		}
	}
}
