package discovery

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"kvrouter/internal/config"
	"kvrouter/internal/enginesim"
	"kvrouter/internal/k8stest"
)

// The tests below run against a real kube-apiserver (internal/k8stest).
// They write EndpointSlices themselves, as the EndpointSlice controller
// would, and Pod statuses, as a kubelet would. Addresses are from
// 192.0.2.0/24 (TEST-NET-1), to which nothing is sent, except in
// TestEngineInNetNS, which serves an engine-sim in a network namespace.

// running is a Source whose Run goroutine the test owns.
type running struct {
	src  *Source
	reg  *prometheus.Registry
	done chan error
}

// start runs a Source until the test ends and checks Run returned nil.
func start(t testing.TB, rc *rest.Config, cfg config.Discovery) *running {
	t.Helper()
	reg := prometheus.NewRegistry()
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
	src, err := New(cfg, rc, log, reg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{src: src, reg: reg, done: make(chan error, 1)}
	go func() { r.done <- src.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-r.done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Run did not return 10 s after its context ended")
		}
	})
	return r
}

// waitFor reads snapshots until one satisfies ok and returns it.
func (r *running) waitFor(t testing.TB, what string, ok func(Snapshot) bool) Snapshot {
	t.Helper()
	deadline := time.After(20 * time.Second)
	var last Snapshot
	for {
		select {
		case s := <-r.src.Snapshots():
			if ok(s) {
				return s
			}
			last = s
		case err := <-r.done:
			t.Fatalf("waiting for %s: Run returned %v", what, err)
		case <-deadline:
			t.Fatalf("no snapshot with %s in 20 s; last: %s", what, show(last))
		}
	}
}

// waitAddrs waits for a snapshot of exactly these addr=state pairs.
func (r *running) waitAddrs(t testing.TB, want ...string) Snapshot {
	t.Helper()
	slices.Sort(want)
	return r.waitFor(t, strings.Join(want, " "), func(s Snapshot) bool { return show(s) == strings.Join(want, " ") })
}

// show renders a snapshot as sorted "addr=state" words.
func show(s Snapshot) string {
	var w []string
	for _, e := range s.Engines {
		w = append(w, e.Addr+"="+e.State.String())
	}
	slices.Sort(w)
	return strings.Join(w, " ")
}

// ep is an endpoint with explicit conditions, naming its Pod.
func ep(ip string, ready, serving, terminating bool) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{
		Addresses:  []string{ip},
		Conditions: discoveryv1.EndpointConditions{Ready: &ready, Serving: &serving, Terminating: &terminating},
		TargetRef:  &corev1.ObjectReference{Kind: "Pod", Name: "pod-" + strings.ReplaceAll(ip, ".", "-")},
	}
}

func readyEP(ip string) discoveryv1.Endpoint { return ep(ip, true, true, false) }

// endpointSlice is a slice of service svc with port "http" 8000.
func endpointSlice(ns, name, svc string, port int32, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	pn := "http"
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{
			discoveryv1.LabelServiceName: svc, discoveryv1.LabelManagedBy: "kvrouter-test"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &pn, Port: &port}},
		Endpoints:   eps,
	}
}

// env is one namespace of a shared cluster.
type env struct {
	c   *k8stest.Cluster
	cs  kubernetes.Interface
	ns  string
	ctx context.Context
}

func newEnv(t testing.TB, c *k8stest.Cluster, ns string) *env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	if err := c.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	return &env{c: c, cs: kubernetes.NewForConfigOrDie(c.Config()), ns: ns, ctx: ctx}
}

func (e *env) apply(t testing.TB, s *discoveryv1.EndpointSlice) {
	t.Helper()
	api := e.cs.DiscoveryV1().EndpointSlices(e.ns)
	cur, err := api.Get(e.ctx, s.Name, metav1.GetOptions{})
	if err == nil {
		s.ResourceVersion = cur.ResourceVersion
		_, err = api.Update(e.ctx, s, metav1.UpdateOptions{})
	} else {
		_, err = api.Create(e.ctx, s, metav1.CreateOptions{})
	}
	if err != nil {
		t.Fatalf("write endpointslice %s: %v", s.Name, err)
	}
}

func (e *env) deleteSlice(t testing.TB, name string) {
	t.Helper()
	if err := e.cs.DiscoveryV1().EndpointSlices(e.ns).Delete(e.ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestKubernetes runs the scenarios that share one AlwaysAllow cluster.
func TestKubernetes(t *testing.T) {
	t.Parallel()
	c := k8stest.Start(t, k8stest.Options{})
	t.Run("Scale", func(t *testing.T) { testScale(t, newEnv(t, c, "scale")) })
	t.Run("Conditions", func(t *testing.T) { testConditions(t, newEnv(t, c, "conditions")) })
	t.Run("PodSelector", func(t *testing.T) { testPodSelector(t, newEnv(t, c, "pods")) })
	t.Run("Annotations", func(t *testing.T) { testAnnotations(t, newEnv(t, c, "annotations")) })
	t.Run("Latency", func(t *testing.T) { testLatency(t, newEnv(t, c, "latency")) })
	t.Run("EngineInNetNS", func(t *testing.T) { testEngineInNetNS(t, newEnv(t, c, "netns")) })
	t.Run("Kubeconfig", func(t *testing.T) { testKubeconfig(t, newEnv(t, c, "kubeconfig")) })
	t.Run("APIKeySecret", func(t *testing.T) { testAPIKeySecret(t, newEnv(t, c, "secrets")) })
	t.Run("InferencePoolPorts", func(t *testing.T) { testPoolTargetPorts(t, newEnv(t, c, "poolports")) })
}

// testKubeconfig: with config.Discovery.Kubeconfig and no rest.Config, New reads
// the file (server, CA, token) as a router outside the cluster would.
func testKubeconfig(t *testing.T, e *env) {
	rc := e.c.Config()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: test, cluster: {server: %q, certificate-authority: %q}}]
users: [{name: admin, user: {token: %q}}]
contexts: [{name: test, context: {cluster: test, user: admin, namespace: %s}}]
current-context: test
`, rc.Host, rc.CAFile, rc.BearerToken, e.ns)
	if err := os.WriteFile(path, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	r := start(t, nil, config.Discovery{Namespace: e.ns, Service: "vllm", Kubeconfig: path})
	e.apply(t, endpointSlice(e.ns, "vllm-a", "vllm", 8000, readyEP("192.0.2.1")))
	r.waitAddrs(t, "192.0.2.1:8000=ready")
}

// testScale: 2 -> 4 (a second slice) -> 1 engines; other Services'
// slices are ignored.
func testScale(t *testing.T, e *env) {
	r := start(t, e.c.Config(), config.Discovery{Namespace: e.ns, Service: "vllm"})
	e.apply(t, endpointSlice(e.ns, "other", "other-svc", 8000, readyEP("192.0.2.99")))
	r.waitAddrs(t) // synced, empty
	e.apply(t, endpointSlice(e.ns, "vllm-a", "vllm", 8000, readyEP("192.0.2.1"), readyEP("192.0.2.2")))
	r.waitAddrs(t, "192.0.2.1:8000=ready", "192.0.2.2:8000=ready")
	e.apply(t, endpointSlice(e.ns, "vllm-b", "vllm", 8000, readyEP("192.0.2.3"), readyEP("192.0.2.4")))
	r.waitAddrs(t, "192.0.2.1:8000=ready", "192.0.2.2:8000=ready", "192.0.2.3:8000=ready", "192.0.2.4:8000=ready")
	e.deleteSlice(t, "vllm-b")
	e.apply(t, endpointSlice(e.ns, "vllm-a", "vllm", 8000, readyEP("192.0.2.2")))
	s := r.waitAddrs(t, "192.0.2.2:8000=ready")
	if s.Engines[0].Name != "pod-192-0-2-2" || s.Engines[0].Settings != (config.EngineSettings{DPSize: 1}) {
		t.Errorf("engine = %+v", s.Engines[0])
	}
	if got := testutil.ToFloat64(r.src.m.engines.WithLabelValues("ready")); got != 1 {
		t.Errorf("kvrouter_discovery_engines{state=ready} = %v, want 1", got)
	}
}

// testConditions: ready -> not ready -> terminating and serving (drain)
// -> terminating, not serving -> gone; the other endpoint stays ready.
func testConditions(t *testing.T, e *env) {
	r := start(t, e.c.Config(), config.Discovery{Namespace: e.ns, Service: "vllm"})
	set := func(a discoveryv1.Endpoint) {
		e.apply(t, endpointSlice(e.ns, "vllm-a", "vllm", 8000, readyEP("192.0.2.1"), a))
	}
	set(readyEP("192.0.2.2"))
	r.waitAddrs(t, "192.0.2.1:8000=ready", "192.0.2.2:8000=ready")
	set(ep("192.0.2.2", false, false, false))
	r.waitAddrs(t, "192.0.2.1:8000=ready", "192.0.2.2:8000=not_ready")
	set(readyEP("192.0.2.2"))
	r.waitAddrs(t, "192.0.2.1:8000=ready", "192.0.2.2:8000=ready")
	set(ep("192.0.2.2", false, true, true))
	r.waitAddrs(t, "192.0.2.1:8000=ready", "192.0.2.2:8000=draining")
	set(ep("192.0.2.2", false, false, true))
	r.waitAddrs(t, "192.0.2.1:8000=ready", "192.0.2.2:8000=not_ready")
	e.apply(t, endpointSlice(e.ns, "vllm-a", "vllm", 8000, readyEP("192.0.2.1")))
	r.waitAddrs(t, "192.0.2.1:8000=ready")
}

// pod creates a Pod and sets its status as a kubelet would.
func (e *env) pod(t testing.TB, name, ip string, labels, ann map[string]string, ready bool) {
	t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns, Labels: labels, Annotations: ann},
		Spec: corev1.PodSpec{
			NodeName:   "node-1", // bound: deletion is graceful, as on a real node
			Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8000}}}},
		},
	}
	p, err := e.cs.CoreV1().Pods(e.ns).Create(e.ctx, p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	e.podStatus(t, p, ip, ready)
}

func (e *env) podStatus(t testing.TB, p *corev1.Pod, ip string, ready bool) {
	t.Helper()
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: st, LastTransitionTime: metav1.Now()}}}
	if _, err := e.cs.CoreV1().Pods(e.ns).UpdateStatus(e.ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// testPodSelector: Pods by label; one relabelled out of the selector is
// gone (vllm-project/router #279); a deleted one drains while it is still
// Ready and terminating, then goes.
func testPodSelector(t *testing.T, e *env) {
	r := start(t, e.c.Config(), config.Discovery{Namespace: e.ns, Selector: "app=vllm,model=llama"})
	sel := map[string]string{"app": "vllm", "model": "llama"}
	e.pod(t, "a", "192.0.2.1", sel, nil, true)
	e.pod(t, "b", "192.0.2.2", sel, nil, true)
	e.pod(t, "c", "192.0.2.3", map[string]string{"app": "vllm", "model": "qwen"}, nil, true)
	r.waitAddrs(t, "192.0.2.1:8000=ready", "192.0.2.2:8000=ready")

	p, err := e.cs.CoreV1().Pods(e.ns).Get(e.ctx, "b", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Labels["model"] = "debug" // taken out of the Service by hand
	if _, err := e.cs.CoreV1().Pods(e.ns).Update(e.ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	r.waitAddrs(t, "192.0.2.1:8000=ready")

	grace := int64(300)
	if err := e.cs.CoreV1().Pods(e.ns).Delete(e.ctx, "a", metav1.DeleteOptions{GracePeriodSeconds: &grace}); err != nil {
		t.Fatal(err)
	}
	r.waitAddrs(t, "192.0.2.1:8000=draining")
	p, err = e.cs.CoreV1().Pods(e.ns).Get(e.ctx, "a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	e.podStatus(t, p, "192.0.2.1", false)
	r.waitAddrs(t, "192.0.2.1:8000=not_ready")
	zero := int64(0)
	if err := e.cs.CoreV1().Pods(e.ns).Delete(e.ctx, "a", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	r.waitAddrs(t)
}

// testAnnotations: a Service's engines get their settings from their
// Pods' annotations over the defaults; an endpoint whose Pod is not known
// yet waits for it; a bad annotation keeps the default and is counted.
func testAnnotations(t *testing.T, e *env) {
	def := config.EngineSettings{EventsPort: 5557, ReplayPort: 5600, DPSize: 1, Topic: "kv@"}
	e.secret(t, "engine-keys", map[string]string{"llama": "sk-llama"})
	r := start(t, e.c.Config(), config.Discovery{Namespace: e.ns, Service: "vllm", PodAnnotations: true, Defaults: def})
	e.pod(t, "pod-192-0-2-1", "192.0.2.1", nil, map[string]string{
		AnnotationEventsPort: "6000", AnnotationReplayPort: "6100", AnnotationDPSize: "2",
		AnnotationTopic: "llama", AnnotationAPIKeySecret: "engine-keys/llama",
	}, true)
	e.pod(t, "pod-192-0-2-2", "192.0.2.2", nil, map[string]string{AnnotationDPSize: "two"}, true)
	e.apply(t, endpointSlice(e.ns, "vllm-a", "vllm", 8000, readyEP("192.0.2.1"), readyEP("192.0.2.2"), readyEP("192.0.2.3")))
	s := r.waitAddrs(t, "192.0.2.1:8000=ready", "192.0.2.2:8000=ready") // no Pod for .3 yet
	want := []Engine{
		{Name: "pod-192-0-2-1", Addr: "192.0.2.1:8000", State: StateReady, Settings: config.EngineSettings{
			EventsPort: 6000, ReplayPort: 6100, DPSize: 2, Topic: "llama", APIKeySecret: config.SecretRef{Name: "engine-keys", Key: "llama"}}, APIKey: "sk-llama",
			Role: config.RoleDecode}, // no llm-d.ai/role label: a decode engine (role.go)
		{Name: "pod-192-0-2-2", Addr: "192.0.2.2:8000", State: StateReady, Settings: def, Role: config.RoleDecode},
	}
	if !equal(s.Engines, want) {
		t.Errorf("engines\n got %+v\nwant %+v", s.Engines, want)
	}
	if got := testutil.ToFloat64(r.src.m.badAnn); got != 1 {
		t.Errorf("kvrouter_discovery_bad_annotations_total = %v, want 1", got)
	}
	e.pod(t, "pod-192-0-2-3", "192.0.2.3", nil, nil, true)
	r.waitAddrs(t, "192.0.2.1:8000=ready", "192.0.2.2:8000=ready", "192.0.2.3:8000=ready")

	p, err := e.cs.CoreV1().Pods(e.ns).Get(e.ctx, "pod-192-0-2-3", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Annotations = map[string]string{AnnotationEventsPort: "0"}
	if _, err := e.cs.CoreV1().Pods(e.ns).Update(e.ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	r.waitFor(t, "events off on .3", func(s Snapshot) bool {
		return len(s.Engines) == 3 && s.Engines[2].Settings.EventsPort == 0 && s.Engines[2].Settings.ReplayPort == 5600
	})
}

// testLatency measures the time from an EndpointSlice write (the API call
// starting) to the snapshot that shows it; the goal is 1 s.
func testLatency(t *testing.T, e *env) {
	const n = 40
	f := newFlipper(t, e)
	var ds []time.Duration
	for range n {
		ds = append(ds, f.flip(t))
	}
	slices.Sort(ds)
	t.Logf("EndpointSlice write to snapshot, %d changes: min %v, median %v, p90 %v, max %v",
		n, ds[0], ds[n/2], ds[n*9/10], ds[n-1])
	if ds[n-1] > time.Second {
		t.Errorf("slowest change took %v, goal 1 s", ds[n-1])
	}
}

// flipper flips one of two endpoints between ready and draining.
type flipper struct {
	r  *running
	e  *env
	rv string // the slice's resourceVersion after the last write
	n  int
}

func newFlipper(tb testing.TB, e *env) *flipper {
	r := start(tb, e.c.Config(), config.Discovery{Namespace: e.ns, Service: "vllm"})
	s, err := e.cs.DiscoveryV1().EndpointSlices(e.ns).Create(e.ctx,
		endpointSlice(e.ns, "vllm-a", "vllm", 8000, readyEP("192.0.2.1"), readyEP("192.0.2.2")), metav1.CreateOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	r.waitAddrs(tb, "192.0.2.1:8000=ready", "192.0.2.2:8000=ready")
	return &flipper{r: r, e: e, rv: s.ResourceVersion}
}

// flip makes one change (one Update call) and returns the time from the
// call to the snapshot showing it.
func (f *flipper) flip(tb testing.TB) time.Duration {
	st, want := ep("192.0.2.2", false, true, true), "192.0.2.2:8000=draining"
	if f.n%2 == 1 {
		st, want = readyEP("192.0.2.2"), "192.0.2.2:8000=ready"
	}
	f.n++
	s := endpointSlice(f.e.ns, "vllm-a", "vllm", 8000, readyEP("192.0.2.1"), st)
	s.ResourceVersion = f.rv
	t0 := time.Now()
	s, err := f.e.cs.DiscoveryV1().EndpointSlices(f.e.ns).Update(f.e.ctx, s, metav1.UpdateOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	f.r.waitAddrs(tb, "192.0.2.1:8000=ready", want)
	d := time.Since(t0)
	f.rv = s.ResourceVersion
	return d
}

// BenchmarkSliceToSnapshot: one EndpointSlice change, from the write to
// the snapshot, against a real kube-apiserver (started once, ~5 s).
//
//	go test -run '^$' -bench SliceToSnapshot -benchtime 200x ./internal/discovery/
func BenchmarkSliceToSnapshot(b *testing.B) {
	c := k8stest.Start(b, k8stest.Options{})
	f := newFlipper(b, newEnv(b, c, "bench"))
	var ds []time.Duration
	for b.Loop() {
		ds = append(ds, f.flip(b))
	}
	slices.Sort(ds)
	b.ReportMetric(float64(ds[len(ds)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(ds[len(ds)*99/100].Microseconds())/1000, "p99-ms")
	b.ReportMetric(float64(ds[len(ds)-1].Microseconds())/1000, "max-ms")
}

// testEngineInNetNS serves an engine-sim inside a network namespace and
// reaches it at the address discovery reported.
func testEngineInNetNS(t *testing.T, e *env) {
	n := k8stest.NewNetNS(t)
	ln, err := n.Listen(0)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := enginesim.New(enginesim.Config{Core: enginesim.CoreConfig{NumGPUBlocks: 256, MaxModelLen: 2048}}, nil, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("engine-sim: %v", err)
		}
	})
	port := int32(ln.Addr().(*net.TCPAddr).Port)

	r := start(t, e.c.Config(), config.Discovery{Namespace: e.ns, Service: "vllm"})
	e.apply(t, endpointSlice(e.ns, "vllm-a", "vllm", port, readyEP(n.Addr.String())))
	s := r.waitFor(t, "the engine", func(s Snapshot) bool { return len(s.Engines) == 1 })
	url := "http://" + s.Engines[0].Addr + "/health"
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	if s.Engines[0].Host() != n.Addr.String() {
		t.Fatalf("engine host %s, want the namespace's %s", s.Engines[0].Host(), n.Addr)
	}
}
