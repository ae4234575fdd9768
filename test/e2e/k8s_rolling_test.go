package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"kvrouter/internal/enginesim"
	"kvrouter/internal/k8stest"
)

// rollEngine is an engine-sim in its own network namespace (a Pod's
// address) that the test can stop.
type rollEngine struct {
	ip, pod string
	stop    func()
}

func startRollEngine(t *testing.T) *rollEngine {
	t.Helper()
	n := k8stest.NewNetNS(t)
	ln, err := n.Listen(8000)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := enginesim.New(enginesim.Config{ServedModelName: "m", Core: enginesim.CoreConfig{Profile: enginesim.ProfileFast, NumGPUBlocks: 1024, MaxModelLen: 4096}}, nil, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, ln) }()
	var once sync.Once
	e := &rollEngine{ip: n.Addr.String(), pod: "pod-" + strings.ReplaceAll(n.Addr.String(), ".", "-")}
	e.stop = func() { once.Do(func() { cancel(); <-served }) }
	t.Cleanup(e.stop)
	return e
}

// TestServeKubernetesRollingReplacement replaces both engines of a
// discovered group, one at a time, as a Deployment's rolling update does
// (a new Pod becomes ready, then an old one terminates while still
// serving, then leaves the EndpointSlice and stops), under 8 concurrent
// clients (4 streaming): no client request fails, the new engines get
// traffic, a terminating engine gets no new requests, a removed one
// leaves no series, in-flight gauges end at 0.
func TestServeKubernetesRollingReplacement(t *testing.T) {
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
	const ns = "roll"
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
	const n = 2
	var old, nu []*rollEngine
	for range n {
		old = append(old, startRollEngine(t))
		nu = append(nu, startRollEngine(t))
	}
	port, pn := int32(8000), "http"
	apply := func(eps ...discoveryv1.Endpoint) time.Time {
		t.Helper()
		s := &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: "vllm-roll", Namespace: ns, Labels: map[string]string{discoveryv1.LabelServiceName: "vllm"}},
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
	ready := func(es ...*rollEngine) []discoveryv1.Endpoint {
		var out []discoveryv1.Endpoint
		for _, e := range es {
			out = append(out, k8sEndpoint(e.ip, true, true, false))
		}
		return out
	}
	apply(ready(old...)...)
	r := serveYAML(t, fmt.Sprintf(`health: {probe_interval: 100ms, scrape_interval: 200ms}
models:
  - name: m
    tokenizer: none
    policy: least_load
    discovery: {namespace: %s, service: vllm, kubeconfig: %q}
`, ns, kubeconfig), 0)
	e2eEventually(t, 30*time.Second, "both old engines up", func() bool {
		return e2eMetric(t, r.url, "kvrouter_fleet_endpoint_up") == n
	})

	tr := &rollTraffic{url: r.url, client: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 16}},
		stop: make(chan struct{}), open: map[string]int{}}
	defer tr.client.CloseIdleConnections()
	began := time.Now()
	tr.start(4, 4)
	// waitServed polls until every engine of es has answered a request.
	waitServed := func(what string, es []*rollEngine) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			per, all := map[string]int{}, true
			for _, e := range es {
				per[e.pod] = tr.served(e.pod)
				all = all && per[e.pod] > 0
			}
			if all {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 30 s; requests answered per engine: %v", what, per)
			}
		}
	}
	waitServed("every old engine answered a request", old)
	var toUp, toDrain, toGone []time.Duration
	drainedAt := map[string]time.Time{}
	live := append([]*rollEngine(nil), old...)
	for i := range n {
		at := apply(ready(append(live, nu[i])...)...)
		e2eEventually(t, 10*time.Second, nu[i].pod+" up", func() bool {
			return e2eMetric(t, r.url, "kvrouter_fleet_endpoint_up", `endpoint="`+nu[i].pod+`"`) == 1 &&
				e2eMetric(t, r.url, "kvrouter_fleet_endpoint_admitted", `endpoint="`+nu[i].pod+`"`) == 1
		})
		toUp = append(toUp, time.Since(at))
		e2eEventually(t, 10*time.Second, nu[i].pod+" routed to", func() bool { _, ok := tr.firstTo(nu[i].pod); return ok })
		live = append(live[1:], nu[i])

		gone := old[i]
		at = apply(append(ready(live...), k8sEndpoint(gone.ip, false, true, true))...)
		e2eEventually(t, 10*time.Second, gone.pod+" draining", func() bool {
			return e2eMetric(t, r.url, "kvrouter_fleet_endpoint_admitted", `endpoint="`+gone.pod+`"`) == 0
		})
		toDrain = append(toDrain, time.Since(at))
		drainedAt[gone.pod] = time.Now()
		time.Sleep(200 * time.Millisecond) // terminating, still serving what it has
		at = apply(ready(live...)...)
		e2eEventually(t, 10*time.Second, gone.pod+" gone", func() bool {
			return e2eMetric(t, r.url, "kvrouter_pool_engines", `model="m"`) == n
		})
		toGone = append(toGone, time.Since(at))
		e2eEventually(t, 30*time.Second, gone.pod+"'s requests finished", func() bool { return tr.openOn(gone.pod) == 0 })
		e2eEventually(t, 10*time.Second, "no series of "+gone.pod, func() bool {
			return !strings.Contains(e2eMetricsText(t, r.url), `"`+gone.pod+`"`)
		})
		gone.stop()
	}
	waitServed("every new engine answered a request", live) // traffic on the new fleet alone
	close(tr.stop)
	tr.wg.Wait()
	elapsed := time.Since(began)

	var failed []string
	per := map[string]int{}
	late := 0 // requests that started on an old engine after it was marked terminating
	for _, rec := range tr.records {
		per[rec.replica]++
		if d, ok := drainedAt[rec.replica]; ok && rec.start.After(d) {
			late++
		}
		if rec.err != "" {
			failed = append(failed, fmt.Sprintf("%s (replica %q): %s", rec.start.Format("15:04:05.000"), rec.replica, rec.err))
		}
	}
	if len(failed) > 0 {
		t.Errorf("%d of %d requests failed:\n%s", len(failed), len(tr.records), strings.Join(failed[:min(len(failed), 20)], "\n"))
	}
	if late > 0 {
		t.Errorf("%d requests started on a terminating engine after the router had marked it so", late)
	}
	for _, e := range nu {
		if per[e.pod] == 0 {
			t.Errorf("new engine %s got no requests: %v", e.pod, per)
		}
	}
	for _, name := range []string{"kvrouter_proxy_in_flight_requests", "kvrouter_routing_in_flight_requests"} {
		e2eEventually(t, 10*time.Second, name+" back to 0", func() bool { return e2eMetric(t, r.url, name) == 0 })
	}
	t.Logf("rolling replacement of %d discovered engines: %d requests in %v, %d failed; per replica %v", n, len(tr.records), elapsed.Round(time.Millisecond), len(failed), per)
	t.Logf("EndpointSlice update -> new engine admitted and up: %v; -> old engine not admitted (terminating): %v; -> old engine out of the pool: %v", toUp, toDrain, toGone)
}
