package e2e

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"kvrouter/internal/config"
	"kvrouter/internal/discovery"
	"kvrouter/internal/k8stest"
)

// podEnv is what the chart's Deployment gives the router container
// (POD_NAME, POD_NAMESPACE from the downward API) for router.yaml's peers.
func podEnv(k string) string {
	return map[string]string{"POD_NAME": "kvr-kvrouter-5d8f9-abcde", "POD_NAMESPACE": "vllm"}[k]
}

// chartPeers is what a render says about router.yaml peers.
type chartPeers struct {
	peers  *config.Peers
	dep    appsv1.Deployment
	env    []corev1.EnvVar
	roles  []rbacv1.Role
	router string
}

func renderPeers(t *testing.T, helm, chart string, args ...string) chartPeers {
	t.Helper()
	out, err := runOut(t, helm, append([]string{"template", "kvr", chart, "-n", "vllm"}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	var c chartPeers
	for _, d := range chartDocs(out) {
		var meta struct {
			Kind string            `json:"kind"`
			Data map[string]string `json:"data"`
		}
		if err := yaml.Unmarshal([]byte(d), &meta); err != nil {
			t.Fatal(err)
		}
		switch meta.Kind {
		case "ConfigMap":
			c.router = meta.Data["router.yaml"]
			cfg, _, err := config.Parse([]byte(c.router), podEnv)
			if err != nil {
				t.Fatalf("router.yaml: %v\n%s", err, c.router)
			}
			c.peers = cfg.Peers
		case "Deployment":
			if err := yaml.UnmarshalStrict([]byte(d), &c.dep); err != nil {
				t.Fatal(err)
			}
			c.env = c.dep.Spec.Template.Spec.Containers[0].Env
		case "Role":
			var r rbacv1.Role
			if err := yaml.UnmarshalStrict([]byte(d), &r); err != nil {
				t.Fatal(err)
			}
			c.roles = append(c.roles, r)
		}
	}
	return c
}

// grantsPods reports whether r lets its holder list and watch Pods.
func grantsPods(r rbacv1.Role) bool {
	for _, rule := range r.Rules {
		if slices.Contains(rule.Resources, "pods") && slices.Contains(rule.Verbs, "list") && slices.Contains(rule.Verbs, "watch") {
			return true
		}
	}
	return false
}

// TestHelmChartPeers: with more than one replica (the default, 2) the
// chart's router.yaml has a peers block whose selector is exactly the
// Deployment's (so it matches its Pods and nothing else), the container
// gets POD_NAME and POD_NAMESPACE from the downward API, and the Role in
// the release's namespace grants list/watch on Pods (a separate Role
// there when the engines are in another namespace). One replica, or
// peers.enabled false, renders none of it; peers.enabled true forces it;
// a routerConfig with its own peers is refused. Against a real
// kube-apiserver with RBAC, discovery.Peers under the chart's
// ServiceAccount finds its place among two Ready router Pods; under a Role
// without list on Pods it stays one router (it never fails).
func TestHelmChartPeers(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs helm and a kube-apiserver")
	}
	helm := k8stest.Helm(t)
	chart := filepath.Join("..", "..", "deploy", "helm", "kvrouter")

	def := renderPeers(t, helm, chart)
	if def.peers == nil {
		t.Fatalf("default (2 replicas): no peers in router.yaml:\n%s", def.router)
	}
	want := labels.SelectorFromSet(def.dep.Spec.Selector.MatchLabels).String()
	if got, err := labels.Parse(def.peers.Selector); err != nil || got.String() != want {
		t.Errorf("peers selector %q (%v), want the Deployment's %q", def.peers.Selector, err, want)
	}
	if sel, _ := labels.Parse(def.peers.Selector); !sel.Matches(labels.Set(def.dep.Spec.Template.Labels)) {
		t.Errorf("peers selector %q does not match the Pod template's labels %v", def.peers.Selector, def.dep.Spec.Template.Labels)
	}
	fields := map[string]string{}
	for _, e := range def.env {
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			fields[e.Name] = e.ValueFrom.FieldRef.FieldPath
		}
	}
	if fields["POD_NAME"] != "metadata.name" || fields["POD_NAMESPACE"] != "metadata.namespace" {
		t.Errorf("container env from the downward API = %v, want POD_NAME and POD_NAMESPACE", fields)
	}
	if len(def.roles) != 1 || !grantsPods(def.roles[0]) {
		t.Errorf("default: Roles %v, want one granting list/watch pods", def.roles)
	}
	for _, args := range [][]string{{"--set", "replicaCount=1"}, {"--set", "peers.enabled=false"},
		{"-f", filepath.Join(chart, "examples", "epp.yaml"), "--set", "peers.enabled=true"}} {
		c := renderPeers(t, helm, chart, args...)
		if c.peers != nil || len(c.env) > 0 || grantsPods(c.roles[0]) && args[0] != "-f" {
			t.Errorf("%v: peers %v, env %v, roles %v: want none", args, c.peers, c.env, c.roles)
		}
	}
	if c := renderPeers(t, helm, chart, "--set", "replicaCount=1", "--set", "peers.enabled=true"); c.peers == nil || len(c.env) != 2 {
		t.Errorf("peers.enabled=true with 1 replica: peers %v, env %v", c.peers, c.env)
	}
	other := renderPeers(t, helm, chart, "--set", "rbac.namespace=engines")
	var inRelease, inEngines int
	for _, r := range other.roles {
		switch {
		case r.Namespace == "vllm" && grantsPods(r):
			inRelease++
		case r.Namespace == "engines" && grantsPods(r):
			inEngines++
		}
	}
	if inRelease != 1 || inEngines != 0 {
		t.Errorf("engines in another namespace: Roles %v, want list/watch pods in vllm only", other.roles)
	}
	if out, err := runOut(t, helm, "template", "kvr", chart, "--set", "routerConfig.peers.selector=x"); err == nil ||
		!strings.Contains(err.Error(), "routerConfig.peers is set by the chart") {
		t.Errorf("routerConfig.peers with peers on: %v\n%s", err, out)
	}

	// The chart's RBAC, for real: two router Pods, the chart's ServiceAccount.
	c := k8stest.Start(t, k8stest.Options{RBAC: true})
	const ns = "routers"
	ctx := t.Context()
	if err := c.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	out, err := runOut(t, helm, "template", "kvr", chart, "-n", ns)
	if err != nil {
		t.Fatal(err)
	}
	rb := parseChartRBAC(t, out)
	rb.create(t, kubernetes.NewForConfigOrDie(c.Config()), "")
	rb.without("pods", "list").create(t, kubernetes.NewForConfigOrDie(c.Config()), "-nolist")
	admin := kubernetes.NewForConfigOrDie(c.Config())
	names := []string{"kvr-kvrouter-5d8f9-abcde", "kvr-kvrouter-5d8f9-vwxyz"}
	for _, name := range names {
		p, err := admin.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: def.dep.Spec.Template.Labels},
			Spec:       corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{Name: "kvrouter", Image: "kvrouter"}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		p.Status = corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
		if _, err := admin.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// place is the first place Run reports under sa's token, or Place()
	// when none comes within wait.
	place := func(sa string, wait time.Duration) [2]int {
		t.Helper()
		rc, err := c.ServiceAccountConfig(ctx, ns, sa)
		if err != nil {
			t.Fatal(err)
		}
		cfg := *def.peers
		cfg.Namespace, cfg.PodName = ns, names[1]
		got := make(chan [2]int, 16)
		p, err := discovery.NewPeers(cfg, rc, func(n, i int) { got <- [2]int{n, i} }, nil)
		if err != nil {
			t.Fatal(err)
		}
		pctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- p.Run(pctx) }()
		defer func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		}()
		select {
		case pl := <-got:
			return pl
		case <-time.After(wait):
			n, i := p.Place()
			return [2]int{n, i}
		}
	}
	// Allowed: the place comes with the first list, 20 s for a loaded
	// machine (at 2 s the test read the place before it was set).
	if got := place(rb.sa.Name, 20*time.Second); got != [2]int{2, 1} {
		t.Errorf("under the chart's ServiceAccount: place %v, want [2 1]", got)
	}
	if got := place(rb.sa.Name+"-nolist", 2*time.Second); got != [2]int{1, 0} {
		t.Errorf("without list on pods: place %v, want [1 0]", got)
	}
}
