package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"kvrouter/internal/enginesim"
	"kvrouter/internal/k8stest"
)

// k8sEngine is an engine-sim serving model m inside its own network
// namespace (a Pod's address), stopped when the test ends.
func k8sEngine(t *testing.T) string {
	t.Helper()
	n := k8stest.NewNetNS(t)
	ln, err := n.Listen(8000)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := enginesim.New(enginesim.Config{ServedModelName: "m", Core: enginesim.CoreConfig{NumGPUBlocks: 256, MaxModelLen: 2048}}, nil, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() { cancel(); <-served })
	return n.Addr.String()
}

// k8sEndpoint is one endpoint of an EndpointSlice, naming its Pod.
func k8sEndpoint(ip string, ready, serving, terminating bool) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{
		Addresses:  []string{ip},
		Conditions: discoveryv1.EndpointConditions{Ready: &ready, Serving: &serving, Terminating: &terminating},
		TargetRef:  &corev1.ObjectReference{Kind: "Pod", Name: "pod-" + strings.ReplaceAll(ip, ".", "-")},
	}
}

// TestServeKubernetesDiscovery runs serve with a model group discovered
// from a real kube-apiserver (EndpointSlices of Service vllm) in front of
// engine-sims in network namespaces: engines added, held back while not
// ready or terminating, removed, all while serving, each change reaching
// routing within 1 s; no request goes to an endpoint that is not ready or
// terminating; a removed engine leaves no series behind.
func TestServeKubernetesDiscovery(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts a kube-apiserver")
	}
	c := k8stest.Start(t, k8stest.Options{})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kube-apiserver log:\n%s", c.Log())
		}
	})
	ctx := t.Context()
	const ns = "serve"
	if err := c.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(c.Config())
	if err != nil {
		t.Fatal(err)
	}
	rc := c.Config()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	kc := fmt.Sprintf("apiVersion: v1\nkind: Config\nclusters: [{name: t, cluster: {server: %q, certificate-authority: %q}}]\n"+
		"users: [{name: a, user: {token: %q}}]\ncontexts: [{name: t, context: {cluster: t, user: a}}]\ncurrent-context: t\n",
		rc.Host, rc.CAFile, rc.BearerToken)
	if err := os.WriteFile(kubeconfig, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	a, b := k8sEngine(t), k8sEngine(t)

	r := serveYAML(t, fmt.Sprintf(`health: {probe_interval: 200ms, scrape_interval: 200ms}
models:
  - name: m
    tokenizer: none
    policy: round_robin
    discovery: {namespace: %s, service: vllm, kubeconfig: %q, defaults: {events_port: 0}}
`, ns, kubeconfig), 0)

	port, pn := int32(8000), "http"
	apply := func(eps ...discoveryv1.Endpoint) time.Time {
		t.Helper()
		s := &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: "vllm-a", Namespace: ns, Labels: map[string]string{discoveryv1.LabelServiceName: "vllm"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: &pn, Port: &port}},
			Endpoints:   eps,
		}
		at := time.Now()
		_, err := cs.DiscoveryV1().EndpointSlices(ns).Update(ctx, s, metav1.UpdateOptions{})
		if err != nil {
			_, err = cs.DiscoveryV1().EndpointSlices(ns).Create(ctx, s, metav1.CreateOptions{})
		}
		if err != nil {
			t.Fatal(err)
		}
		return at
	}
	replicas := func(n int) map[string]int {
		t.Helper()
		seen := map[string]int{}
		for range n {
			resp, out := r.post("/v1/completions", `{"model":"m","prompt":[1,2,3,4],"max_tokens":2}`)
			if resp.StatusCode != 200 {
				seen[fmt.Sprint(resp.StatusCode)]++
				_ = out
				continue
			}
			seen[resp.Header.Get("X-Kvrouter-Replica")]++
		}
		return seen
	}
	podA, podB := "pod-"+strings.ReplaceAll(a, ".", "-"), "pod-"+strings.ReplaceAll(b, ".", "-")
	// waitRouted polls until every request goes to exactly the want set
	// and returns how long after since that took.
	waitRouted := func(what string, since time.Time, want ...string) time.Duration {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			got := replicas(2 * len(want))
			ok := len(got) == len(want)
			for _, w := range want {
				ok = ok && got[w] > 0
			}
			if ok {
				return time.Since(since)
			}
		}
		t.Fatalf("%s: requests still go to %v, want %v", what, replicas(4), want)
		return 0
	}

	at := apply(k8sEndpoint(a, true, true, false))
	waitRouted("one engine", at, podA)
	at = apply(k8sEndpoint(a, true, true, false), k8sEndpoint(b, true, true, false))
	d := waitRouted("scaled to two", at, podA, podB)
	at = apply(k8sEndpoint(a, true, true, false), k8sEndpoint(b, false, false, false))
	d = max(d, waitRouted("b not ready", at, podA))
	at = apply(k8sEndpoint(a, true, true, false), k8sEndpoint(b, true, true, false))
	d = max(d, waitRouted("b ready again", at, podA, podB))
	at = apply(k8sEndpoint(a, false, true, true), k8sEndpoint(b, true, true, false))
	d = max(d, waitRouted("a terminating", at, podB))
	// From here on a gets nothing: 50 requests all on b.
	if got := replicas(50); got[podB] != 50 {
		t.Fatalf("with a terminating: %v", got)
	}
	at = apply(k8sEndpoint(b, true, true, false))
	// a gets nothing already (terminating): requests going to b alone say
	// nothing about the removal, so wait for a to leave the pool.
	e2eEventually(t, 10*time.Second, "a out of the pool", func() bool {
		return e2eMetric(t, r.url, "kvrouter_pool_engines", `model="m"`) == 1
	})
	d = max(d, time.Since(at))
	t.Logf("EndpointSlice change to routing change: at most %v (polling every 10 ms)", d)
	if d > time.Second {
		t.Errorf("an EndpointSlice change took %v to reach routing, goal 1 s", d)
	}
	// Every series naming the engine (fleet endpoint=, proxy and routing
	// replica=, ...) goes with it, those its last requests wrote once they
	// are counted.
	var left []string
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get(r.url + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		left = left[:0]
		for l := range strings.Lines(string(body)) {
			if strings.Contains(l, `="`+podA+`"`) {
				left = append(left, strings.TrimSpace(l))
			}
		}
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, l := range left {
		t.Errorf("removed engine %s left a series: %s", podA, l)
	}
	if err := cs.DiscoveryV1().EndpointSlices(ns).Delete(ctx, "vllm-a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if got := replicas(1); got["503"] == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no engine left: requests still answered %v", replicas(1))
		}
	}
}
