package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"kvrouter/internal/config"
	"kvrouter/internal/discovery"
	"kvrouter/internal/k8stest"
)

// chartDocs splits helm template output into its YAML documents.
func chartDocs(out []byte) []string {
	var docs []string
	for _, d := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(out), -1) {
		if strings.TrimSpace(d) != "" {
			docs = append(docs, d)
		}
	}
	return docs
}

// chartRBAC is what a chart render grants its router: the ServiceAccount,
// Role and RoleBinding, and the discovery configuration of its
// router.yaml's first model group.
type chartRBAC struct {
	sa   corev1.ServiceAccount
	role rbacv1.Role
	rb   rbacv1.RoleBinding
	disc config.Discovery
}

func parseChartRBAC(t *testing.T, out []byte) chartRBAC {
	t.Helper()
	var c chartRBAC
	seen := map[string]bool{}
	for _, d := range chartDocs(out) {
		var meta struct {
			Kind string            `json:"kind"`
			Data map[string]string `json:"data"`
		}
		if err := yaml.Unmarshal([]byte(d), &meta); err != nil {
			t.Fatal(err)
		}
		var err error
		switch meta.Kind {
		case "ServiceAccount":
			err = yaml.UnmarshalStrict([]byte(d), &c.sa)
		case "Role":
			err = yaml.UnmarshalStrict([]byte(d), &c.role)
		case "RoleBinding":
			err = yaml.UnmarshalStrict([]byte(d), &c.rb)
		case "ConfigMap":
			cfg, _, perr := config.Parse([]byte(meta.Data["router.yaml"]), podEnv)
			if perr != nil || cfg.Models[0].Discovery == nil {
				t.Fatalf("router.yaml: %v", perr)
			}
			c.disc = *cfg.Models[0].Discovery
		default:
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", meta.Kind, err)
		}
		seen[meta.Kind] = true
	}
	for _, k := range []string{"ServiceAccount", "Role", "RoleBinding", "ConfigMap"} {
		if !seen[k] {
			t.Fatalf("render has no %s", k)
		}
	}
	return c
}

// create applies the ServiceAccount, Role and RoleBinding with the
// administrator's client, under names ending in suffix ("" the chart's).
func (c chartRBAC) create(t *testing.T, cs kubernetes.Interface, suffix string) {
	t.Helper()
	ctx := t.Context()
	sa, role, rb := c.sa.DeepCopy(), c.role.DeepCopy(), c.rb.DeepCopy()
	sa.Name += suffix
	role.Name += suffix
	rb.Name += suffix
	rb.RoleRef.Name, rb.Subjects[0].Name = role.Name, sa.Name
	if _, err := cs.CoreV1().ServiceAccounts(sa.Namespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.RbacV1().Roles(role.Namespace).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.RbacV1().RoleBindings(rb.Namespace).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// without returns c with verb removed from the rule on resource.
func (c chartRBAC) without(resource, verb string) chartRBAC {
	c.role = *c.role.DeepCopy()
	for i, r := range c.role.Rules {
		if slices.Contains(r.Resources, resource) {
			c.role.Rules[i].Verbs = slices.DeleteFunc(slices.Clone(r.Verbs), func(v string) bool { return v == verb })
		}
	}
	c.role.Rules = slices.DeleteFunc(c.role.Rules, func(r rbacv1.PolicyRule) bool { return len(r.Verbs) == 0 })
	return c
}

// runDiscovery runs the real discovery with cfg under rc until the test
// ends and returns its snapshots and Run's result.
func runDiscovery(t *testing.T, cfg config.Discovery, rc *rest.Config) (<-chan discovery.Snapshot, <-chan error) {
	t.Helper()
	src, err := discovery.New(cfg, rc, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done, finished := make(chan error, 1), make(chan struct{})
	go func() { done <- src.Run(ctx); close(finished) }()
	t.Cleanup(func() { cancel(); <-finished })
	return src.Snapshots(), done
}

// testChartRBAC applies the RBAC objects the chart renders (Pods and
// Secrets enabled) to kube-apiserver in RBAC mode, takes a token for the
// chart's ServiceAccount from the TokenRequest API and runs the real
// discovery, configured by the chart's router.yaml, under it: EndpointSlice
// mode with Pod annotations and Pod-selector mode, engines with API keys
// from a Secret. It syncs and follows changes. With any one verb removed
// from the Role, Run fails at once with an error naming that call.
func testChartRBAC(t *testing.T, c *k8stest.Cluster, helm, chart string) {
	const ns = "engines"
	ctx := t.Context()
	if err := c.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	admin := kubernetes.NewForConfigOrDie(c.Config())
	render := func(values string) chartRBAC {
		t.Helper()
		f := filepath.Join(t.TempDir(), "values.yaml")
		if err := os.WriteFile(f, []byte(values), 0o600); err != nil {
			t.Fatal(err)
		}
		out, err := runOut(t, helm, "template", "kvr", chart, "-n", ns, "-f", f)
		if err != nil {
			t.Fatal(err)
		}
		return parseChartRBAC(t, out)
	}
	svc := render(`rbac: {pods: true, secrets: [vllm-keys]}
routerConfig:
  models:
    - name: m
      tokenizer: none
      discovery:
        namespace: '{{ .Release.Namespace }}'
        service: vllm
        pod_annotations: true
        defaults: {api_key_secret: {name: vllm-keys, key: shared}}
`)
	sel := render(`rbac: {pods: true, secrets: [vllm-keys]}
routerConfig:
  models:
    - name: m
      tokenizer: none
      discovery:
        namespace: '{{ .Release.Namespace }}'
        selector: app=vllm
`)
	if !reflectEqualRules(svc.role.Rules, sel.role.Rules) {
		t.Fatalf("the two renders' Roles differ:\n%v\n%v", svc.role.Rules, sel.role.Rules)
	}
	svc.create(t, admin, "")

	if _, err := admin.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "vllm-keys", Namespace: ns},
		StringData: map[string]string{"shared": "key-s", "a": "key-a"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := func(name, ip string, ann map[string]string) {
		t.Helper()
		p, err := admin.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": "vllm"}, Annotations: ann},
			Spec:       corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{Name: "vllm", Image: "vllm", Ports: []corev1.ContainerPort{{ContainerPort: 8000}}}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
		if _, err := admin.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	slice := func(ips ...string) {
		t.Helper()
		var eps []discoveryv1.Endpoint
		for _, ip := range ips {
			eps = append(eps, k8sEndpoint(ip, true, true, false))
		}
		writeSlice(t, admin, ns, "vllm-a", eps...)
	}
	pod("pod-192-0-2-1", "192.0.2.1", map[string]string{discovery.AnnotationAPIKeySecret: "vllm-keys/a", discovery.AnnotationEventsPort: "5557"})
	slice("192.0.2.1")

	token, err := c.ServiceAccountConfig(ctx, ns, svc.sa.Name)
	if err != nil {
		t.Fatal(err)
	}
	wait := func(snaps <-chan discovery.Snapshot, done <-chan error, want string) {
		t.Helper()
		deadline := time.After(20 * time.Second)
		last := ""
		for {
			select {
			case s := <-snaps:
				if last = showKeys(s); last == want {
					return
				}
			case err := <-done:
				t.Fatalf("waiting for %s: Run returned %v", want, err)
			case <-deadline:
				t.Fatalf("no snapshot %q in 20 s; last %q", want, last)
			}
		}
	}
	t.Run("Service", func(t *testing.T) {
		snaps, done := runDiscovery(t, svc.disc, token)
		wait(snaps, done, "192.0.2.1:8000 key-a events 5557")
		pod("pod-192-0-2-2", "192.0.2.2", nil)
		slice("192.0.2.1", "192.0.2.2")
		wait(snaps, done, "192.0.2.1:8000 key-a events 5557, 192.0.2.2:8000 key-s events 0")
	})
	t.Run("Selector", func(t *testing.T) {
		snaps, done := runDiscovery(t, sel.disc, token)
		wait(snaps, done, "192.0.2.1:8000 key-a events 5557, 192.0.2.2:8000 events 0")
		pod("pod-192-0-2-3", "192.0.2.3", nil)
		wait(snaps, done, "192.0.2.1:8000 key-a events 5557, 192.0.2.2:8000 events 0, 192.0.2.3:8000 events 0")
	})

	// Each verb the Role grants is one discovery calls: without it, Run
	// ends at once naming the call.
	for i, tc := range []struct {
		resource, verb string
		cfg            config.Discovery
		want           string
	}{
		{"endpointslices", "list", svc.disc, "not allowed in namespace engines: list endpointslices.discovery.k8s.io"},
		{"endpointslices", "watch", svc.disc, "not allowed in namespace engines: watch endpointslices.discovery.k8s.io"},
		{"pods", "list", sel.disc, "not allowed in namespace engines: list pods"},
		{"pods", "watch", sel.disc, "not allowed in namespace engines: watch pods"},
		{"secrets", "get", svc.disc, "not allowed in namespace engines: get secrets vllm-keys"},
		{"secrets", "get", sel.disc, `api key secret refused: engine pod-192-0-2-1 (kvrouter/api-key-secret vllm-keys/a) in namespace engines: secrets "vllm-keys" is forbidden`},
	} {
		t.Run("Without/"+tc.verb+"-"+tc.resource, func(t *testing.T) {
			suffix := fmt.Sprintf("-no%d", i)
			svc.without(tc.resource, tc.verb).create(t, admin, suffix)
			rc, err := c.ServiceAccountConfig(ctx, ns, svc.sa.Name+suffix)
			if err != nil {
				t.Fatal(err)
			}
			t0 := time.Now()
			_, done := runDiscovery(t, tc.cfg, rc)
			select {
			case err := <-done:
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("Run = %v, want an error with %q", err, tc.want)
				}
				if tc.resource != "secrets" || strings.Contains(tc.want, "not allowed") {
					if !errors.Is(err, discovery.ErrForbidden) {
						t.Errorf("Run = %v: not ErrForbidden", err)
					}
				}
				t.Logf("refused after %v: %v", time.Since(t0).Round(time.Millisecond), err)
			case <-time.After(20 * time.Second):
				t.Fatalf("Run without %s %s still running after 20 s", tc.verb, tc.resource)
			}
		})
	}
}

// showKeys renders a snapshot as "addr key-K events P" per engine.
func showKeys(s discovery.Snapshot) string {
	var w []string
	for _, e := range s.Engines {
		v := e.Addr
		if e.APIKey != "" {
			v += " " + e.APIKey
		}
		w = append(w, fmt.Sprintf("%s events %d", v, e.Settings.EventsPort))
	}
	return strings.Join(w, ", ")
}

func reflectEqualRules(a, b []rbacv1.PolicyRule) bool {
	x, _ := yaml.Marshal(a)
	y, _ := yaml.Marshal(b)
	return string(x) == string(y)
}
