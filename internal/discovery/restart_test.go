package discovery

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"kvrouter/internal/k8stest"
)

// TestAPIServerRestart: kube-apiserver stops, an EndpointSlice is deleted
// meanwhile (in etcd, as another API server would), kube-apiserver comes
// back: the informer cannot resume its watch, re-lists, and the deleted
// endpoint does not survive (production-stack #656, "zombie IPs").
func TestAPIServerRestart(t *testing.T) {
	t.Parallel()
	c := k8stest.Start(t, k8stest.Options{})
	e := newEnv(t, c, "restart")
	r := start(t, c.Config(), Config{Namespace: e.ns, Service: "vllm"})
	e.apply(t, endpointSlice(e.ns, "vllm-a", "vllm", 8000, readyEP("192.0.2.1")))
	e.apply(t, endpointSlice(e.ns, "vllm-b", "vllm", 8000, readyEP("192.0.2.2")))
	r.waitAddrs(t, "192.0.2.1:8000=ready", "192.0.2.2:8000=ready")
	lists := testutil.ToFloat64(r.src.m.lists)

	t0 := time.Now()
	c.StopAPIServer()
	t.Logf("kube-apiserver stopped in %v", time.Since(t0).Round(time.Millisecond))
	if n, err := c.EtcdDelete(e.ctx, "/registry/endpointslices/"+e.ns+"/vllm-b"); err != nil || n != 1 {
		t.Fatalf("EtcdDelete = %d, %v; want 1 key", n, err)
	}
	t0 = time.Now()
	if err := c.StartAPIServer(); err != nil {
		t.Fatal(err)
	}
	t.Logf("kube-apiserver ready again in %v", time.Since(t0).Round(time.Millisecond))
	t0 = time.Now()
	r.waitAddrs(t, "192.0.2.1:8000=ready")
	relists := testutil.ToFloat64(r.src.m.lists) - lists
	t.Logf("deleted endpoint gone %v after kube-apiserver was ready again; %v re-lists, %v watch errors",
		time.Since(t0).Round(time.Millisecond), relists, testutil.ToFloat64(r.src.m.watchErrors))
	if relists < 1 {
		t.Errorf("no re-list after the restart (the deletion arrived another way)")
	}
	// The source keeps watching.
	e.apply(t, endpointSlice(e.ns, "vllm-a", "vllm", 8000, readyEP("192.0.2.1"), readyEP("192.0.2.3")))
	r.waitAddrs(t, "192.0.2.1:8000=ready", "192.0.2.3:8000=ready")
}

// rbacObjects reads deploy/kubernetes/discovery-rbac.yaml for namespace ns.
func rbacObjects(t *testing.T, ns string) (*rbacv1.Role, *rbacv1.RoleBinding) {
	t.Helper()
	b, err := os.ReadFile("../../deploy/kubernetes/discovery-rbac.yaml")
	if err != nil {
		t.Fatal(err)
	}
	docs := strings.Split(strings.ReplaceAll(string(b), "NAMESPACE", ns), "\n---\n")
	if len(docs) != 2 {
		t.Fatalf("%d YAML documents, want a Role and a RoleBinding", len(docs))
	}
	var role rbacv1.Role
	var rb rbacv1.RoleBinding
	if err := yaml.UnmarshalStrict([]byte(docs[0]), &role); err != nil || role.Kind != "Role" {
		t.Fatalf("Role: %v (kind %q)", err, role.Kind)
	}
	if err := yaml.UnmarshalStrict([]byte(docs[1]), &rb); err != nil || rb.Kind != "RoleBinding" {
		t.Fatalf("RoleBinding: %v (kind %q)", err, rb.Kind)
	}
	return &role, &rb
}

// TestRBAC runs discovery under a ServiceAccount token with RBAC on: the
// Role in deploy/ grants what it needs (nothing more: its rules are
// checked), without the pods rule a pod selector is refused, without the
// Role nothing works, and Run says so.
func TestRBAC(t *testing.T) {
	t.Parallel()
	c := k8stest.Start(t, k8stest.Options{RBAC: true})
	e := newEnv(t, c, "engines")
	admin := e.cs.RbacV1()
	role, rb := rbacObjects(t, e.ns)

	want := []rbacv1.PolicyRule{
		{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list", "watch"}},
	}
	if got, _ := yaml.Marshal(role.Rules); string(got) != string(must(yaml.Marshal(want))) {
		t.Fatalf("Role rules:\n%s\nwant exactly:\n%s", got, must(yaml.Marshal(want)))
	}
	// The same Role without its pods rule, bound to a second account.
	noPods := role.DeepCopy()
	noPods.Name, noPods.Rules = "kvrouter-discovery-no-pods", noPods.Rules[:1]
	rbNoPods := rb.DeepCopy()
	rbNoPods.Name, rbNoPods.RoleRef.Name, rbNoPods.Subjects[0].Name = noPods.Name, noPods.Name, "kvrouter-no-pods"
	for _, r := range []*rbacv1.Role{role, noPods} {
		if _, err := admin.Roles(e.ns).Create(e.ctx, r, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, b := range []*rbacv1.RoleBinding{rb, rbNoPods} {
		if _, err := admin.RoleBindings(e.ns).Create(e.ctx, b, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	account := func(name string) *rest.Config {
		rc, err := c.ServiceAccountConfig(e.ctx, e.ns, name)
		if err != nil {
			t.Fatal(err)
		}
		return rc
	}
	full, slicesOnly, none := account("kvrouter"), account("kvrouter-no-pods"), account("nobody")

	e.pod(t, "pod-192-0-2-1", "192.0.2.1", map[string]string{"app": "vllm"}, map[string]string{AnnotationEventsPort: "5557"}, true)
	e.apply(t, endpointSlice(e.ns, "vllm-a", "vllm", 8000, readyEP("192.0.2.1")))

	t.Run("Role/service+annotations", func(t *testing.T) {
		r := start(t, full, Config{Namespace: e.ns, Service: "vllm", PodAnnotations: true})
		s := r.waitAddrs(t, "192.0.2.1:8000=ready")
		if s.Engines[0].Settings.EventsPort != 5557 {
			t.Errorf("annotations not read: %+v", s.Engines[0])
		}
	})
	t.Run("Role/selector", func(t *testing.T) {
		start(t, full, Config{Namespace: e.ns, Selector: "app=vllm"}).waitAddrs(t, "192.0.2.1:8000=ready")
	})
	t.Run("NoPodsRule/service", func(t *testing.T) {
		start(t, slicesOnly, Config{Namespace: e.ns, Service: "vllm"}).waitAddrs(t, "192.0.2.1:8000=ready")
	})
	refused := func(t *testing.T, rc *rest.Config, cfg Config, what string) {
		src, err := New(cfg, rc, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		t0 := time.Now()
		err = src.Run(ctx)
		if !(apierrors.IsForbidden(err) || errors.Is(err, ErrForbidden)) || !strings.Contains(err.Error(), what) || errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Run = %v, want forbidden for %s", err, what)
		}
		t.Logf("refused after %v: %v", time.Since(t0).Round(time.Millisecond), err)
	}
	t.Run("NoPodsRule/selector", func(t *testing.T) {
		refused(t, slicesOnly, Config{Namespace: e.ns, Selector: "app=vllm"}, "pods")
	})
	t.Run("NoPodsRule/annotations", func(t *testing.T) {
		refused(t, slicesOnly, Config{Namespace: e.ns, Service: "vllm", PodAnnotations: true}, "pods")
	})
	t.Run("NoRole", func(t *testing.T) {
		refused(t, none, Config{Namespace: e.ns, Service: "vllm"}, "endpointslices")
	})
	t.Run("OtherNamespace", func(t *testing.T) {
		if err := c.CreateNamespace(e.ctx, "elsewhere"); err != nil {
			t.Fatal(err)
		}
		refused(t, full, Config{Namespace: "elsewhere", Service: "vllm"}, "endpointslices")
	})
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}
