package e2e

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"kvrouter/internal/k8stest"
)

// k8sScenario is one namespace of the shared cluster, a router serving a
// model group discovered there and engine-sims in network namespaces.
type k8sScenario struct {
	t    *testing.T
	c    *k8stest.Cluster
	cs   kubernetes.Interface
	ns   string
	r    *e2eRouter
	sims map[string]*countedSim // by Pod name

	mu     sync.Mutex
	served map[string]map[int]bool // replica -> distinct prompts it answered
	fresh  int                     // waitRouted's next prompt, from 10000
}

func newK8sScenario(t *testing.T, c *k8stest.Cluster, ns string, engines int) *k8sScenario {
	t.Helper()
	if err := c.CreateNamespace(t.Context(), ns); err != nil {
		t.Fatal(err)
	}
	s := &k8sScenario{t: t, c: c, cs: kubernetes.NewForConfigOrDie(c.Config()), ns: ns, sims: map[string]*countedSim{}, served: map[string]map[int]bool{}}
	for i := range engines {
		s.sims[fmt.Sprintf("e%d", i)] = startCountedSim(t)
	}
	return s
}

// serve starts the router with policy and discovery lines (inside
// discovery: {...}). round_robin sends to every routable engine in turn,
// so an engine that gets nothing is one the router holds back; kv (with
// the approximate index) records index entries.
func (s *k8sScenario) serve(policy, discovery string) {
	s.t.Helper()
	s.r = serveYAML(s.t, fmt.Sprintf(`health: {probe_interval: 200ms, scrape_interval: 200ms}
models:
  - name: m
    tokenizer: none
    policy: %s
    discovery: {namespace: %s, kubeconfig: %q, %s}
`, policy, s.ns, kubeconfigFile(s.t, s.c), discovery), slog.LevelWarn)
}

// ep is pod's endpoint with the given conditions.
func (s *k8sScenario) ep(pod string, ready, serving, terminating bool) discoveryv1.Endpoint {
	e := k8sEndpoint(s.sims[pod].ip, ready, serving, terminating)
	e.TargetRef.Name = pod
	return e
}

// pod creates a running, ready Pod with labels (and annotations) at
// sim's address.
func (s *k8sScenario) pod(name string, labels map[string]string, ann ...map[string]string) {
	s.t.Helper()
	var a map[string]string
	if len(ann) > 0 {
		a = ann[0]
	}
	p, err := s.cs.CoreV1().Pods(s.ns).Create(s.t.Context(), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: s.ns, Labels: labels, Annotations: a},
		Spec:       corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{Name: "vllm", Image: "vllm", Ports: []corev1.ContainerPort{{ContainerPort: 8000}}}}},
	}, metav1.CreateOptions{})
	if err != nil {
		s.t.Fatal(err)
	}
	ip := s.sims[name].ip
	p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	if _, err := s.cs.CoreV1().Pods(s.ns).UpdateStatus(s.t.Context(), p, metav1.UpdateOptions{}); err != nil {
		s.t.Fatal(err)
	}
}

// send posts one completion (distinct prompt n < 1,000,000: its first two
// token ids spell n, every id below the engine-sim's vocabulary) with extra
// headers and returns its status and the replica that served it.
func (s *k8sScenario) send(n int, hdr ...string) (int, string) {
	prompt := make([]string, 64)
	for i := range prompt {
		prompt[i] = fmt.Sprint(1000 + i)
	}
	prompt[0], prompt[1] = fmt.Sprint(1000+n/1000), fmt.Sprint(1000+n%1000)
	req, _ := http.NewRequest(http.MethodPost, s.r.url+"/v1/completions",
		strings.NewReader(`{"model":"m","prompt":[`+strings.Join(prompt, ",")+`],"max_tokens":2}`))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := s.r.client.Do(req)
	if err != nil {
		return 0, err.Error() // safe from any goroutine; callers check the status
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return 0, err.Error()
	}
	rep := resp.Header.Get("X-Kvrouter-Replica")
	if resp.StatusCode == 200 {
		s.mu.Lock()
		if s.served[rep] == nil {
			s.served[rep] = map[int]bool{}
		}
		s.served[rep][n] = true
		s.mu.Unlock()
	}
	return resp.StatusCode, rep
}

// prompts returns how many distinct prompts each replica answered.
func (s *k8sScenario) prompts(rep string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.served[rep])
}

// waitRouted polls until 2*len(want) requests in a row all go to the want
// set (and each of it); it returns the time since since. Every request
// has a prompt never sent before: under kv a prompt repeated would stay
// on the engine that cached it (one that became routable first), and an
// engine that became routable later would never be seen.
func (s *k8sScenario) waitRouted(what string, since time.Time, want ...string) time.Duration {
	s.t.Helper()
	var last map[string]int
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		got := map[string]int{}
		for range 2 * len(want) {
			s.mu.Lock()
			n := 10000 + s.fresh
			s.fresh++
			s.mu.Unlock()
			code, rep := s.send(n)
			if code != 200 {
				rep = fmt.Sprint(code)
			}
			got[rep]++
		}
		ok := len(got) == len(want)
		for _, w := range want {
			ok = ok && got[w] > 0
		}
		if ok {
			return time.Since(since)
		}
		last = got
	}
	s.t.Fatalf("%s: requests do not go to exactly %v (last round: %v)", what, want, last)
	return 0
}

// noneTo sends n requests and fails if any reaches one of the sims named
// in gone (by their own count) or fails.
func (s *k8sScenario) noneTo(n int, gone ...string) {
	s.t.Helper()
	before := map[string]int64{}
	for _, g := range gone {
		before[g] = s.sims[g].arrived.Load()
	}
	for i := range n {
		if code, rep := s.send(100 + i); code != 200 || slicesContains(gone, rep) {
			s.t.Fatalf("request %d: %d from %q", i, code, rep)
		}
	}
	for _, g := range gone {
		if d := s.sims[g].arrived.Load() - before[g]; d != 0 {
			s.t.Errorf("%s (not routable) received %d requests", g, d)
		}
	}
}

// settled checks that the router's in-flight requests and leases return
// to zero, that the index holds only the replicas left, and that every
// sim has nothing in flight.
func (s *k8sScenario) settled(replicas int) {
	s.t.Helper()
	e2eEventually(s.t, 10*time.Second, "in-flight requests, leases and index replicas settle", func() bool {
		return e2eMetric(s.t, s.r.url, "kvrouter_proxy_in_flight_requests") == 0 &&
			e2eMetric(s.t, s.r.url, "kvrouter_routing_in_flight_requests") == 0 &&
			e2eMetric(s.t, s.r.url, "kvrouter_kvindex_replicas", `index="approx"`) == float64(replicas)
	})
	for name, sim := range s.sims {
		if n := sim.inFlight.Load(); n != 0 {
			s.t.Errorf("engine %s still has %d requests in flight", name, n)
		}
	}
}

func slicesContains(xs []string, x string) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

// TestServeKubernetesScenarios runs serve against a real kube-apiserver
// with engine-sims in network namespaces: a Pod relabelled out of the
// selector; an endpoint not ready, then terminating, with requests in
// flight on it; the API server stopped while an engine is deleted; a
// router killed mid-traffic and replaced. Each asserts that no request
// reaches an engine that is not routable (the engine counts), that the
// router's in-flight requests and leases return to zero and that removed
// engines leave the index, and logs the change-to-routing time.
func TestServeKubernetesScenarios(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts a kube-apiserver")
	}
	c := k8stest.Start(t, k8stest.Options{})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kube-apiserver log:\n%s", c.Log())
		}
	})
	t.Run("Relabel", func(t *testing.T) { testRelabel(t, newK8sScenario(t, c, "relabel", 2)) })
	t.Run("NotReadyThenTerminating", func(t *testing.T) { testNotReadyTerminating(t, newK8sScenario(t, c, "drain", 2)) })
	t.Run("RouterRestart", func(t *testing.T) { testRouterRestart(t, newK8sScenario(t, c, "restart", 2)) })
	// Last: it stops the shared API server.
	t.Run("APIServerRestart", func(t *testing.T) { testAPIServerDown(t, newK8sScenario(t, c, "apidown", 2)) })
}

// testRelabel: engines by Pod selector; e1 relabelled out of it stops
// getting requests (vllm-project/router #279) and leaves the index.
func testRelabel(t *testing.T, s *k8sScenario) {
	// e0's API key comes from a Secret (kvrouter/api-key-secret).
	if _, err := s.cs.CoreV1().Secrets(s.ns).Create(t.Context(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "keys", Namespace: s.ns},
		StringData: map[string]string{"e0": "sk-e0\n"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s.pod("e0", map[string]string{"app": "vllm"}, map[string]string{"kvrouter/api-key-secret": "keys/e0"})
	s.pod("e1", map[string]string{"app": "vllm"})
	s.serve("kv", "selector: app=vllm")
	s.waitRouted("two engines", time.Now(), "e0", "e1")
	if got, _ := s.sims["e0"].auth.Load().(string); got != "Bearer sk-e0" {
		t.Errorf("e0 got Authorization %q, want its key from the Secret", got)
	}
	if got, _ := s.sims["e1"].auth.Load().(string); got != "" {
		t.Errorf("e1 (no key) got Authorization %q", got)
	}
	// The approximate index holds, per replica, the blocks of each
	// distinct prompt it answered (all prompts have the same length).
	entries := e2eMetric(t, s.r.url, "kvrouter_kvindex_entries", `index="approx"`)
	n0, n1 := s.prompts("e0"), s.prompts("e1")
	perPrompt := int(entries) / (n0 + n1)
	if perPrompt == 0 || float64(perPrompt*(n0+n1)) != entries || n1 == 0 {
		t.Fatalf("index before: %v entries for %d+%d prompts", entries, n0, n1)
	}
	p, err := s.cs.CoreV1().Pods(s.ns).Get(t.Context(), "e1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Labels["app"] = "debug"
	at := time.Now()
	if _, err := s.cs.CoreV1().Pods(s.ns).Update(t.Context(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	d := s.waitRouted("e1 relabelled", at, "e0")
	t.Logf("Pod relabelled out of the selector to routing change: %v", d.Round(time.Millisecond))
	s.noneTo(50, "e1")
	s.settled(1)
	if after, want := e2eMetric(t, s.r.url, "kvrouter_kvindex_entries", `index="approx"`), perPrompt*s.prompts("e0"); after != float64(want) {
		t.Errorf("index entries after e1 left: %v, want %d (e0's %d prompts only; e1 had %d)", after, want, s.prompts("e0"), n1)
	}
}

// testNotReadyTerminating: requests held in flight on e1; e1 not ready,
// then terminating and serving: it gets nothing new and its held requests
// finish (200); then it is gone.
func testNotReadyTerminating(t *testing.T, s *k8sScenario) {
	writeSlice(t, s.cs, s.ns, "vllm-a", s.ep("e1", true, true, false))
	s.serve("round_robin", "service: vllm")
	s.waitRouted("e1 alone", time.Now(), "e1")
	const held = 4
	var wg sync.WaitGroup
	codes := make(chan int, held)
	for i := range held {
		wg.Go(func() {
			code, _ := s.send(500+i, "X-Test-Hold", "1")
			codes <- code
		})
	}
	e2eEventually(t, 10*time.Second, "held requests reach e1", func() bool { return s.sims["e1"].inFlight.Load() == held })
	writeSlice(t, s.cs, s.ns, "vllm-a", s.ep("e0", true, true, false), s.ep("e1", true, true, false))
	s.waitRouted("e0 added", time.Now(), "e0", "e1")
	// waitRouted sent requests to e1 too; only the held ones stay.
	at := time.Now()
	writeSlice(t, s.cs, s.ns, "vllm-a", s.ep("e0", true, true, false), s.ep("e1", false, false, false))
	d1 := s.waitRouted("e1 not ready", at, "e0")
	s.noneTo(30, "e1")
	at = time.Now()
	writeSlice(t, s.cs, s.ns, "vllm-a", s.ep("e0", true, true, false), s.ep("e1", false, true, true))
	e2eEventually(t, 10*time.Second, "e1 draining", func() bool {
		return e2eMetric(t, s.r.url, "kvrouter_discovery_engines", `state="draining"`) == 1
	})
	d2 := time.Since(at)
	s.noneTo(30, "e1")
	if n := s.sims["e1"].inFlight.Load(); n != held {
		t.Fatalf("e1 has %d requests in flight, want the %d held", n, held)
	}
	s.sims["e1"].Release()
	wg.Wait()
	close(codes)
	for code := range codes {
		if code != 200 {
			t.Errorf("a request in flight on the terminating engine ended %d", code)
		}
	}
	at = time.Now()
	writeSlice(t, s.cs, s.ns, "vllm-a", s.ep("e0", true, true, false))
	e2eEventually(t, 10*time.Second, "e1 removed", func() bool {
		return e2eMetric(t, s.r.url, "kvrouter_pool_engines") == 1
	})
	d3 := time.Since(at)
	t.Logf("not ready to routing change: %v; terminating to draining (at most): %v; gone to removed from the pool: %v",
		d1.Round(time.Millisecond), d2.Round(time.Millisecond), d3.Round(time.Millisecond))
	s.noneTo(20, "e1")
	s.settled(1)
}

// testAPIServerDown: kube-apiserver stops, e1's EndpointSlice is deleted
// meanwhile (in etcd), kube-apiserver comes back: the router keeps
// serving throughout, and after the re-list e1 gets nothing
// (production-stack #656) and has left the index.
func testAPIServerDown(t *testing.T, s *k8sScenario) {
	writeSlice(t, s.cs, s.ns, "vllm-a", s.ep("e0", true, true, false))
	writeSlice(t, s.cs, s.ns, "vllm-b", s.ep("e1", true, true, false))
	s.serve("round_robin", "service: vllm")
	s.waitRouted("two engines", time.Now(), "e0", "e1")
	s.c.StopAPIServer()
	if n, err := s.c.EtcdDelete(t.Context(), "/registry/endpointslices/"+s.ns+"/vllm-b"); err != nil || n != 1 {
		t.Fatalf("EtcdDelete = %d, %v", n, err)
	}
	// The router serves on the fleet it knows while the API server is down.
	for i := range 10 {
		if code, _ := s.send(700 + i); code != 200 {
			t.Fatalf("with the API server down: %d", code)
		}
	}
	if err := s.c.StartAPIServer(); err != nil {
		t.Fatal(err)
	}
	d := s.waitRouted("e1 deleted while the API server was down", time.Now(), "e0")
	t.Logf("API server ready again to the deleted engine gone from routing: %v", d.Round(time.Millisecond))
	s.noneTo(50, "e1")
	s.settled(1)
}
