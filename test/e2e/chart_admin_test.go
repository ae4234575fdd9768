package e2e

import (
	"bytes"
	"errors"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"kvrouter/internal/config"
	"kvrouter/internal/k8stest"
)

// btoi is 1 for true.
func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// chartObject is the part of a rendered manifest the admin checks read.
type chartObject struct {
	Kind     string `yaml:"kind"`
	Metadata struct {
		Name   string            `yaml:"name"`
		Labels map[string]string `yaml:"labels"`
	} `yaml:"metadata"`
	Data map[string]string `yaml:"data"`
	Spec struct {
		// Service
		Ports []struct {
			Name       string `yaml:"name"`
			Port       int    `yaml:"port"`
			TargetPort string `yaml:"targetPort"`
		} `yaml:"ports"`
		// ServiceMonitor
		Selector struct {
			MatchLabels map[string]string `yaml:"matchLabels"`
		} `yaml:"selector"`
		Endpoints []struct {
			Port string `yaml:"port"`
			Path string `yaml:"path"`
		} `yaml:"endpoints"`
		// Deployment
		Template struct {
			Spec struct {
				Containers []struct {
					Ports []struct {
						Name          string `yaml:"name"`
						ContainerPort int    `yaml:"containerPort"`
					} `yaml:"ports"`
					Liveness  chartProbe `yaml:"livenessProbe"`
					Readiness chartProbe `yaml:"readinessProbe"`
				} `yaml:"containers"`
			} `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

type chartProbe struct {
	HTTPGet struct {
		Path string `yaml:"path"`
		Port string `yaml:"port"`
	} `yaml:"httpGet"`
}

func decodeChart(t *testing.T, out []byte) []chartObject {
	t.Helper()
	var objs []chartObject
	dec := yaml.NewDecoder(bytes.NewReader(out))
	for {
		var o chartObject
		if err := dec.Decode(&o); errors.Is(err, io.EOF) {
			return objs
		} else if err != nil {
			t.Fatal(err)
		}
		if o.Kind != "" {
			objs = append(objs, o)
		}
	}
}

// matches reports whether labels carry every label of sel.
func matches(sel, labels map[string]string) bool {
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return len(sel) > 0
}

// With admin.port set the chart turns router.yaml's admin_listen on, and
// the probes and the ServiceMonitor use the admin port through a Service
// of its own that the ServiceMonitor alone selects; without it all stay on
// the main port. admin.port in mode epp and a routerConfig.admin_listen of
// one's own are refused.
func TestHelmChartAdminPort(t *testing.T) {
	helm := k8stest.Helm(t)
	chart := filepath.Join("..", "..", "deploy", "helm", "kvrouter")
	render := func(args ...string) ([]byte, error) {
		return exec.CommandContext(t.Context(), helm, append([]string{"template", "kvr", chart, "-n", "vllm", "--set", "serviceMonitor.enabled=true"}, args...)...).CombinedOutput()
	}
	for _, tc := range []struct {
		name string
		args []string
		port string // the probes' and the scrape's port name
	}{
		{"default", nil, "http"},
		{"admin.port", []string{"--set", "admin.port=9090"}, "admin"},
	} {
		out, err := render(tc.args...)
		if err != nil {
			t.Fatalf("%s: helm template: %v\n%s", tc.name, err, out)
		}
		var monitor *chartObject
		services := map[string]chartObject{}
		for _, o := range decodeChart(t, out) {
			switch o.Kind {
			case "ConfigMap":
				cfg, _, err := config.Parse([]byte(o.Data["router.yaml"]), podEnv)
				if err != nil {
					t.Fatalf("%s: router.yaml: %v", tc.name, err)
				}
				if want := map[string]string{"http": "", "admin": ":9090"}[tc.port]; cfg.AdminListen != want {
					t.Errorf("%s: admin_listen %q, want %q", tc.name, cfg.AdminListen, want)
				}
			case "Deployment":
				c := o.Spec.Template.Spec.Containers[0]
				if c.Liveness.HTTPGet.Port != tc.port || c.Readiness.HTTPGet.Port != tc.port {
					t.Errorf("%s: probes on ports %q and %q, want %q", tc.name, c.Liveness.HTTPGet.Port, c.Readiness.HTTPGet.Port, tc.port)
				}
				ports := map[string]int{}
				for _, p := range c.Ports {
					ports[p.Name] = p.ContainerPort
				}
				if tc.port == "admin" && ports["admin"] != 9090 || tc.port == "http" && ports["admin"] != 0 {
					t.Errorf("%s: container ports %v", tc.name, ports)
				}
			case "Service":
				services[o.Metadata.Name] = o
			case "ServiceMonitor":
				monitor = &o
			}
		}
		if monitor == nil || len(monitor.Spec.Endpoints) != 1 || monitor.Spec.Endpoints[0].Port != tc.port || monitor.Spec.Endpoints[0].Path != "/metrics" {
			t.Fatalf("%s: ServiceMonitor %+v, want one endpoint scraping /metrics on port %q", tc.name, monitor, tc.port)
		}
		// The ServiceMonitor's Services: those its selector matches that
		// name its port.
		var scraped []string
		for name, svc := range services {
			for _, p := range svc.Spec.Ports {
				if p.Name == tc.port && p.TargetPort == tc.port && matches(monitor.Spec.Selector.MatchLabels, svc.Metadata.Labels) {
					scraped = append(scraped, name)
				}
			}
		}
		if want := map[string]string{"http": "kvr-kvrouter", "admin": "kvr-kvrouter-admin"}[tc.port]; len(scraped) != 1 || scraped[0] != want {
			t.Errorf("%s: the ServiceMonitor scrapes Services %v, want [%s] (Services %v)", tc.name, scraped, want, services)
		}
		if tc.port == "admin" {
			for _, p := range services["kvr-kvrouter"].Spec.Ports {
				if p.Name == "admin" {
					t.Errorf("admin.port: the client Service exposes the admin port")
				}
			}
		}
	}
	for _, tc := range []struct {
		name, want string
		args       []string
	}{
		{"admin.port in mode epp", "admin.port needs mode serve", []string{"--set", "admin.port=9090", "-f", filepath.Join(chart, "examples", "epp.yaml")}},
		{"routerConfig.admin_listen", "routerConfig.admin_listen is set by the chart", []string{"--set", "routerConfig.admin_listen=:9090"}},
	} {
		if out, err := render(tc.args...); err == nil || !strings.Contains(string(out), tc.want) {
			t.Errorf("%s: %v, want the chart to refuse it (%q):\n%s", tc.name, err, tc.want, out)
		}
	}
}
