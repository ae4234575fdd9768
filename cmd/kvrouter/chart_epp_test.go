package main

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"go.yaml.in/yaml/v3"

	"kvrouter/internal/k8stest"
)

// TestHelmChartEPPArgs: kvrouter epp accepts the arguments of the
// Deployment the chart renders with examples/epp.yaml (the rest of the
// chart's checks are test/e2e's TestHelmChart).
func TestHelmChartEPPArgs(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs helm")
	}
	helm := k8stest.Helm(t)
	chart := filepath.Join("..", "..", "deploy", "helm", "kvrouter")
	out, err := exec.CommandContext(t.Context(), helm, "template", "kvr", chart, "-n", "vllm", "-f", filepath.Join(chart, "examples", "epp.yaml")).CombinedOutput()
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	chartEPPArgs(t, out)
}

// chartEPPArgs checks that kvrouter epp accepts the rendered Deployment's
// arguments with the rendered router.yaml: one model group on the
// InferencePool the chart renders, with the chart's ext_proc port.
func chartEPPArgs(t *testing.T, out []byte) {
	t.Helper()
	var args []string
	var routerYAML, pool string
	dec := yaml.NewDecoder(bytes.NewReader(out))
	for {
		var doc struct {
			Kind     string
			Metadata struct{ Name string }
			Data     map[string]string
			Spec     struct {
				Template struct {
					Spec struct {
						Containers []struct{ Args []string }
					}
				}
			}
		}
		if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		switch doc.Kind {
		case "Deployment":
			args = doc.Spec.Template.Spec.Containers[0].Args
		case "ConfigMap":
			routerYAML = doc.Data["router.yaml"]
		case "InferencePool":
			pool = doc.Metadata.Name
		}
	}
	if len(args) < 3 || args[0] != "epp" || args[1] != "--config" {
		t.Fatalf("epp Deployment args %q, want epp --config ...", args)
	}
	f := filepath.Join(t.TempDir(), "router.yaml")
	if err := os.WriteFile(f, []byte(routerYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	args = slices.Clone(args[1:])
	args[1] = f
	var errb bytes.Buffer
	fl, err := parseEPPFlags(args, func(string) string { return "" }, stdio{err: &errb})
	if err != nil {
		t.Fatalf("kvrouter epp %q: %v\n%s", args, err, errb.String())
	}
	if fl.grpcListen != ":9002" || len(fl.serve.opts.Config.Models) != 1 || fl.serve.opts.Config.Models[0].Discovery == nil ||
		fl.serve.opts.Config.Models[0].Discovery.InferencePool != pool || pool == "" {
		t.Errorf("kvrouter epp from the chart: grpc %q, models %+v; want :9002 and one group on InferencePool %q", fl.grpcListen, fl.serve.opts.Config.Models, pool)
	}
}
