package discovery

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prometheus/client_golang/prometheus/testutil"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"kvrouter/internal/config"
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
	r := start(t, c.Config(), config.Discovery{Namespace: e.ns, Service: "vllm"})
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
		r := start(t, full, config.Discovery{Namespace: e.ns, Service: "vllm", PodAnnotations: true})
		s := r.waitAddrs(t, "192.0.2.1:8000=ready")
		if s.Engines[0].Settings.EventsPort != 5557 {
			t.Errorf("annotations not read: %+v", s.Engines[0])
		}
	})
	t.Run("Role/selector", func(t *testing.T) {
		start(t, full, config.Discovery{Namespace: e.ns, Selector: "app=vllm"}).waitAddrs(t, "192.0.2.1:8000=ready")
	})
	t.Run("NoPodsRule/service", func(t *testing.T) {
		start(t, slicesOnly, config.Discovery{Namespace: e.ns, Service: "vllm"}).waitAddrs(t, "192.0.2.1:8000=ready")
	})
	refused := func(t *testing.T, rc *rest.Config, cfg config.Discovery, what string) {
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
		refused(t, slicesOnly, config.Discovery{Namespace: e.ns, Selector: "app=vllm"}, "pods")
	})
	t.Run("NoPodsRule/annotations", func(t *testing.T) {
		refused(t, slicesOnly, config.Discovery{Namespace: e.ns, Service: "vllm", PodAnnotations: true}, "pods")
	})
	t.Run("NoRole", func(t *testing.T) {
		refused(t, none, config.Discovery{Namespace: e.ns, Service: "vllm"}, "endpointslices")
	})
	t.Run("OtherNamespace", func(t *testing.T) {
		if err := c.CreateNamespace(e.ctx, "elsewhere"); err != nil {
			t.Fatal(err)
		}
		refused(t, full, config.Discovery{Namespace: "elsewhere", Service: "vllm"}, "endpointslices")
	})
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}

// syncBuffer is a bytes.Buffer safe for a logger and the test reading it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestAPIServerOutageCatchUp: discovery under the router's ServiceAccount
// (the Role in deploy/, RBAC on), with Pod annotations (two watchers: the
// EndpointSlices and the Pods). kube-apiserver stops for 12 s, long enough
// for client-go's default backoff to have grown to several seconds; one
// change per watcher is made meanwhile in etcd (a slice deleted, an
// endpoint's Pod deleted). Once kube-apiserver answers /readyz again, both
// changes must reach the snapshot within 1 s: a watcher retries at most
// 0.3 s after a failure (retryCap with its jitter), the watch that cannot
// resume after the restart re-lists at once, and a refusal by the new
// server's authorizer before its cache loads costs one more retry, so
// 0.6 s of delays at most plus a few requests. No refusal is logged above
// Debug; the outage is logged once per watch when it starts and when it
// ends.
func TestAPIServerOutageCatchUp(t *testing.T) {
	t.Parallel()
	c := k8stest.Start(t, k8stest.Options{RBAC: true})
	e := newEnv(t, c, "outage")
	role, rb := rbacObjects(t, e.ns)
	if _, err := e.cs.RbacV1().Roles(e.ns).Create(e.ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.cs.RbacV1().RoleBindings(e.ns).Create(e.ctx, rb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rc, err := c.ServiceAccountConfig(e.ctx, e.ns, rb.Subjects[0].Name)
	if err != nil {
		t.Fatal(err)
	}
	for _, ip := range []string{"192.0.2.1", "192.0.2.2", "192.0.2.3"} {
		e.pod(t, "pod-"+strings.ReplaceAll(ip, ".", "-"), ip, map[string]string{"app": "vllm"}, nil, true)
	}
	e.apply(t, endpointSlice(e.ns, "vllm-a", "vllm", 8000, readyEP("192.0.2.1"), readyEP("192.0.2.2")))
	e.apply(t, endpointSlice(e.ns, "vllm-c", "vllm", 8000, readyEP("192.0.2.3")))

	logs := &syncBuffer{}
	reg := prometheus.NewRegistry()
	src, err := New(config.Discovery{Namespace: e.ns, Service: "vllm", PodAnnotations: true}, rc,
		slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})), reg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{src: src, reg: reg, done: make(chan error, 1)}
	go func() { r.done <- src.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-r.done; err != nil {
			t.Errorf("Run: %v", err)
		}
		if t.Failed() {
			t.Logf("discovery log:\n%s", logs.String())
		}
	})
	r.waitAddrs(t, "192.0.2.1:8000=ready", "192.0.2.2:8000=ready", "192.0.2.3:8000=ready")
	errs0, lists0 := testutil.ToFloat64(src.m.watchErrors), testutil.ToFloat64(src.m.lists)

	c.StopAPIServer()
	stopped := time.Now()
	for _, key := range []string{"/registry/endpointslices/" + e.ns + "/vllm-c", "/registry/pods/" + e.ns + "/pod-192-0-2-2"} {
		if n, err := c.EtcdDelete(e.ctx, key); err != nil || n != 1 {
			t.Fatalf("EtcdDelete %s = %d, %v; want 1 key", key, n, err)
		}
	}
	// The outage lasts 12 s; nothing can reach the source meanwhile.
	const outage = 12 * time.Second
	for time.Since(stopped) < outage {
		select {
		case s := <-src.Snapshots():
			t.Fatalf("snapshot during the outage: %s", show(s))
		case err := <-r.done:
			t.Fatalf("Run returned during the outage: %v", err)
		case <-time.After(outage - time.Since(stopped)):
		}
	}
	// When kube-apiserver accepts connections again (it answers some
	// requests before /readyz is 200).
	listening := make(chan time.Time, 1)
	pollCtx, stopPoll := context.WithCancel(e.ctx)
	go func() {
		host := strings.TrimPrefix(c.URL(), "https://")
		for pollCtx.Err() == nil {
			if conn, err := net.DialTimeout("tcp", host, time.Second); err == nil {
				conn.Close()
				listening <- time.Now()
				return
			}
			time.Sleep(5 * time.Millisecond) // polling a port: no event to wait on
		}
	}()
	type started struct {
		at  time.Time
		err error
	}
	ready := make(chan started, 1)
	go func() {
		err := c.StartAPIServer() // returns once /readyz is 200 (polled every 200 ms)
		ready <- started{time.Now(), err}
	}()
	// Snapshots are read as they come, while kube-apiserver starts.
	r.waitAddrs(t, "192.0.2.1:8000=ready")
	caught := time.Now()
	st := <-ready
	if st.err != nil {
		t.Fatal(st.err)
	}
	stopPoll()
	var listen time.Time
	select {
	case listen = <-listening:
	default:
	}
	back := st.at
	took := caught.Sub(back) // negative: caught up before /readyz said so
	t.Logf("outage %v (stop to /readyz); %v failed list-and-watches, %v re-lists; both changes in the snapshot %v after kube-apiserver answered /readyz (%v after it accepted connections)",
		back.Sub(stopped).Round(time.Millisecond), testutil.ToFloat64(src.m.watchErrors)-errs0, testutil.ToFloat64(src.m.lists)-lists0,
		took.Round(time.Millisecond), caught.Sub(listen).Round(time.Millisecond))
	if took > time.Second {
		t.Errorf("caught up %v after kube-apiserver was back, want <= 1 s", took.Round(time.Millisecond))
	}
	for _, line := range strings.Split(logs.String(), "\n") {
		if (strings.Contains(line, "forbidden") || strings.Contains(line, "Unauthorized")) && !strings.Contains(line, "level=DEBUG") {
			t.Errorf("a refusal logged above Debug: %s", line)
		}
		if strings.Contains(line, "level=ERROR") {
			t.Errorf("an error logged: %s", line)
		}
	}
	if n := strings.Count(logs.String(), "forbidden"); n > 0 {
		t.Logf("%d refusal lines at Debug", n)
	}
	// The outage is told once per watch at Warn, its end at Info.
	for _, want := range []string{`level=WARN msg="discovery: list or watch failed`, `level=INFO msg="discovery: API server answering again after failures"`} {
		if n := strings.Count(logs.String(), want); n != 2 {
			t.Errorf("%d lines %s, want one per watch", n, want)
		}
	}
	// The source keeps watching.
	e.apply(t, endpointSlice(e.ns, "vllm-a", "vllm", 8000, readyEP("192.0.2.1"), readyEP("192.0.2.3")))
	r.waitAddrs(t, "192.0.2.1:8000=ready", "192.0.2.3:8000=ready")
}
