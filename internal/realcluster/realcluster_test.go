package realcluster

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"kvrouter/internal/image"
	"kvrouter/internal/k8stest"
)

const (
	ns          = "kvr"
	release     = "kvr"
	model       = "meta-llama/Llama-3.1-8B-Instruct"
	engineImage = "kvrouter:test" // the same image runs `kvrouter engine-sim`
	routerSel   = "app.kubernetes.io/name=kvrouter,app.kubernetes.io/instance=" + release
	engineSel   = "app=vllm"
)

// helmBin is helm as set-up builds it (KVROUTER_HELM), else on PATH.
func helmBin(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("KVROUTER_HELM"); p != "" {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if p, err := exec.LookPath("helm"); err == nil {
		return p
	}
	if os.Getenv(k8stest.RequiredEnv) == "1" {
		t.Fatal("helm not found (KVROUTER_HELM or PATH): run make setup-test")
	}
	t.Skip("realcluster: skipped: helm not found (make setup-test builds it)")
	return ""
}

// buildImages builds the static kvrouter binary and the pause program and
// writes their image archives as `make image` does.
func buildImages(t *testing.T, dir string) (kvr, pause string, drain bool) {
	t.Helper()
	for _, b := range []struct{ out, pkg string }{{"kvrouter", "../../cmd/kvrouter"}, {"pause", "../../tools/pause"}} {
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", filepath.Join(dir, b.out), b.pkg)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", b.pkg, err, out)
		}
	}
	kvr, pause = filepath.Join(dir, "kvrouter.oci.tar"), filepath.Join(dir, "pause.oci.tar")
	if err := image.WriteFile(kvr, image.Spec{Binary: filepath.Join(dir, "kvrouter"), Path: "/usr/local/bin/kvrouter",
		Ref: engineImage, ExposedPorts: []string{"8080/tcp"}, Cmd: []string{"serve", "--listen", ":8080", "--config", "/etc/kvrouter/router.yaml"}}); err != nil {
		t.Fatal(err)
	}
	if err := image.WriteFile(pause, image.Spec{Binary: filepath.Join(dir, "pause"), Path: "/pause", Ref: k8stest.PauseRef, User: "65535:65535"}); err != nil {
		t.Fatal(err)
	}
	// Graceful drain of engine-sim on SIGTERM (vllm serve --shutdown-timeout).
	help, _ := exec.Command(filepath.Join(dir, "kvrouter"), "engine-sim", "-h").CombinedOutput()
	return kvr, pause, bytes.Contains(help, []byte("shutdown-timeout"))
}

// TestRealCluster runs the chart's Pods and engine-sim Pods on a real node
// and checks serving through the router Pods' addresses.
func TestRealCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts a Kubernetes node")
	}
	k8stest.RequireNode(t)
	helm := helmBin(t)
	start := time.Now()
	kvrImage, pauseImage, drain := buildImages(t, t.TempDir())
	t.Logf("images built in %s", time.Since(start).Round(time.Millisecond))

	node := k8stest.StartNode(t, k8stest.NodeOptions{Images: []string{kvrImage}, Pause: pauseImage})
	t.Logf("node Ready %s after the test's start", time.Since(start).Round(time.Millisecond))
	cs, err := kubernetes.NewForConfig(node.Config())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	if err := node.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	c := &cluster{t: t, node: node, cs: cs}
	c.createEngines(ctx, 2, drain)
	c.waitEngines(ctx, 2)

	// --- helm install; router Pods Ready ---
	values := filepath.Join(t.TempDir(), "values.yaml")
	os.WriteFile(values, []byte(`image: {repository: kvrouter, tag: test, pullPolicy: Never}
resources:
  requests: {cpu: 100m, memory: 64Mi}
  limits: {memory: 1Gi}
`), 0o644)
	t0 := time.Now()
	if out, err := exec.CommandContext(ctx, helm, "install", release, "../../deploy/helm/kvrouter", "--namespace", ns,
		"--kubeconfig", node.Kubeconfig(), "--values", values).CombinedOutput(); err != nil {
		t.Fatalf("helm install: %v\n%s", err, out)
	}
	routers := c.waitRouters(ctx, 2, 2*time.Minute)
	t.Logf("RESULT router Pods Ready %.1f s after helm install", time.Since(t0).Seconds())
	// The two replicas found each other (router.yaml peers from the chart).
	c.waitFor(ctx, "both routers at their place among 2", 30*time.Second, func() (bool, string) {
		seen := ""
		for _, ip := range routers {
			m := c.metrics(ctx, ip)
			seen += fmt.Sprintf(" %s: routers=%v", ip, m.values("kvrouter_discovery_peers_routers"))
			if !m.has("kvrouter_discovery_peers_routers", "2") {
				return false, seen
			}
		}
		return true, seen
	})

	engines := c.podNames(ctx, engineSel)
	t.Run("Serve", func(t *testing.T) {
		c := c.with(t)
		byReplica := map[string]int{}
		for i := range 40 {
			r := c.complete(ctx, routers[i%2], fmt.Sprintf("request %d: tell me about the number %d", i, i*7919), 8)
			if r.err != nil || r.status != 200 {
				t.Fatalf("request %d via %s: status %d, %v", i, routers[i%2], r.status, r.err)
			}
			byReplica[r.replica]++
		}
		for rep := range byReplica {
			if !contains(engines, rep) {
				t.Fatalf("X-Kvrouter-Replica %q is no engine Pod (%v)", rep, engines)
			}
		}
		t.Logf("40 of 40 requests 200 through both router Pods; per engine %v", byReplica)
	})

	t.Run("Affinity", func(t *testing.T) {
		c := c.with(t)
		long := strings.Repeat("You are a careful assistant who answers about Kubernetes routing. ", 60)
		first := c.complete(ctx, routers[0], long+"Question 0?", 4)
		if first.err != nil || first.status != 200 {
			t.Fatalf("first request: status %d, %v", first.status, first.err)
		}
		for i := 1; i <= 10; i++ {
			r := c.complete(ctx, routers[i%2], long+fmt.Sprintf("Question %d?", i), 4)
			if r.err != nil || r.status != 200 || r.replica != first.replica {
				t.Fatalf("repeat %d via %s: status %d, replica %q, want %q (%v)", i, routers[i%2], r.status, r.replica, first.replica, r.err)
			}
		}
		t.Logf("11 requests sharing a %d-byte prefix all on %s through both routers", len(long), first.replica)
	})

	t.Run("Scale", func(t *testing.T) {
		c := c.with(t)
		before := c.podNames(ctx, engineSel)
		t0 := time.Now()
		c.scaleEngines(ctx, 3)
		added := c.waitRoutable(ctx, routers, 3, 2*time.Minute)
		up := time.Since(t0)
		var fresh string
		for _, e := range added {
			if !contains(before, e) {
				fresh = e
			}
		}
		t.Logf("RESULT scale 2 -> 3: the new engine %s routable on both routers %.2f s after the scale call", fresh, up.Seconds())
		// A request reaches it: new prompts (distinct from their first
		// block on, so no engine holds any of them) spread by load.
		t1, rounds := time.Now(), 0
		c.waitFor(ctx, "a request on the new engine "+fresh, 90*time.Second, func() (bool, string) {
			var wg sync.WaitGroup
			got := make([]string, 6)
			rounds++
			for i := range got {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r := c.complete(ctx, routers[i%2], fmt.Sprintf("%d-%d: spread over the engines", time.Now().UnixNano(), i), 32)
					got[i] = r.replica
				}()
			}
			wg.Wait()
			return contains(got, fresh), fmt.Sprint(got)
		})
		t.Logf("the new engine served a request in round %d of 6 concurrent requests, %.2f s after it was routable", rounds, time.Since(t1).Seconds())
		t0 = time.Now()
		c.scaleEngines(ctx, 1)
		left := c.waitRoutable(ctx, routers, 1, 2*time.Minute)
		t.Logf("RESULT scale 3 -> 1: routing on %v only %.2f s after the scale call", left, time.Since(t0).Seconds())
		for i := range 10 {
			r := c.complete(ctx, routers[i%2], fmt.Sprintf("after scale-down %d", i), 4)
			if r.err != nil || r.status != 200 || r.replica != left[0] {
				t.Fatalf("after scale-down, request %d: status %d, replica %q, want %s (%v)", i, r.status, r.replica, left[0], r.err)
			}
		}
		t0 = time.Now()
		c.scaleEngines(ctx, 2)
		c.waitRoutable(ctx, routers, 2, 2*time.Minute)
		t.Logf("scale 1 -> 2: routable %.2f s after the scale call", time.Since(t0).Seconds())
	})

	t.Run("DeleteEngineUnderLoad", func(t *testing.T) {
		c := c.with(t)
		if !drain {
			t.Skip("engine-sim has no --shutdown-timeout (graceful drain on SIGTERM) in this tree: streams on a deleted engine Pod would be cut")
		}
		c.deleteUnderLoad(ctx, routers)
	})

	t.Run("RollingUpdate", func(t *testing.T) {
		c := c.with(t)
		c.rollingUpdate(ctx, helm, values)
	})

	t.Run("APIServerRestart", func(t *testing.T) {
		c := c.with(t)
		c.apiServerRestart(ctx)
	})

	// The chart's Role was enough: no refused call in any router's log.
	for _, p := range c.podNames(ctx, routerSel) {
		if l := node.ContainerLog(ns, p, "kvrouter"); strings.Contains(l, "forbidden") {
			t.Errorf("router Pod %s logged a forbidden call:\n%s", p, grepLines(l, "forbidden"))
		}
	}
	t.Logf("whole test %s", time.Since(start).Round(time.Second))
}

// cluster holds what the checks share.
type cluster struct {
	t    *testing.T
	node *k8stest.Node
	cs   kubernetes.Interface
}

// with is c for subtest t.
func (c *cluster) with(t *testing.T) *cluster {
	cc := *c
	cc.t = t
	return &cc
}

// waitFor polls cond every 100 ms until it holds; it fails the test with
// the last thing cond saw after within.
func (c *cluster) waitFor(ctx context.Context, what string, within time.Duration, cond func() (bool, string)) {
	c.t.Helper()
	deadline := time.Now().Add(within)
	seen := ""
	for {
		ok, s := cond()
		if ok {
			return
		}
		seen = s
		if time.Now().After(deadline) || ctx.Err() != nil {
			c.t.Fatalf("%s: not after %s; last seen: %s", what, within, seen)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// createEngines creates the engine-sim Deployment and its Service, "vllm"
// (the chart's default discovery service), with the Pod settings an
// engine needs to drain (terminationGracePeriodSeconds beyond the engine's
// --shutdown-timeout) when engine-sim has them.
func (c *cluster) createEngines(ctx context.Context, replicas int32, drain bool) {
	c.t.Helper()
	args := []string{"engine-sim", "--host", "0.0.0.0", "--port", "8000",
		"--kv-events-config", `{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5600","topic":""}`}
	grace := int64(5)
	if drain {
		args = append(args, "--shutdown-timeout", "30")
		grace = 40
	}
	labels := map[string]string{"app": "vllm"}
	yes, uid := true, int64(65532)
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "vllm", Namespace: ns, Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					TerminationGracePeriodSeconds: &grace,
					SecurityContext:               &corev1.PodSecurityContext{RunAsNonRoot: &yes, RunAsUser: &uid},
					Containers: []corev1.Container{{
						Name: "engine", Image: engineImage, ImagePullPolicy: corev1.PullNever, Args: args,
						Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8000}, {Name: "events", ContainerPort: 5557}, {Name: "replay", ContainerPort: 5600}},
						ReadinessProbe: &corev1.Probe{
							ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/health", Port: intstr.FromInt32(8000)}},
							PeriodSeconds: 1,
						},
						Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
							corev1.ResourceCPU: resource.MustParse("50m"), corev1.ResourceMemory: resource.MustParse("32Mi")}},
						SecurityContext: &corev1.SecurityContext{ReadOnlyRootFilesystem: &yes},
					}},
				},
			},
		},
	}
	if _, err := c.cs.AppsV1().Deployments(ns).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		c.t.Fatal(err)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "vllm", Namespace: ns},
		Spec:       corev1.ServiceSpec{Selector: labels, Ports: []corev1.ServicePort{{Name: "http", Port: 8000, TargetPort: intstr.FromInt32(8000)}}},
	}
	if _, err := c.cs.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		c.t.Fatal(err)
	}
}

func (c *cluster) scaleEngines(ctx context.Context, n int32) {
	c.t.Helper()
	patch := fmt.Sprintf(`{"spec":{"replicas":%d}}`, n)
	if _, err := c.cs.AppsV1().Deployments(ns).Patch(ctx, "vllm", types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		c.t.Fatal(err)
	}
}

// readyPods lists the Pods matching sel that are Ready and not
// terminating, by name, with their IPs; seen describes all of them.
func (c *cluster) readyPods(ctx context.Context, sel string) (names, ips []string, seen string) {
	pods, err := c.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return nil, nil, err.Error()
	}
	sort.Slice(pods.Items, func(i, j int) bool { return pods.Items[i].Name < pods.Items[j].Name })
	for _, p := range pods.Items {
		ready := false
		for _, cd := range p.Status.Conditions {
			ready = ready || (cd.Type == corev1.PodReady && cd.Status == corev1.ConditionTrue)
		}
		seen += fmt.Sprintf(" %s(%s ready=%v ip=%s deleting=%v)", p.Name, p.Status.Phase, ready, p.Status.PodIP, p.DeletionTimestamp != nil)
		if ready && p.DeletionTimestamp == nil && p.Status.PodIP != "" {
			names = append(names, p.Name)
			ips = append(ips, p.Status.PodIP)
		}
	}
	return names, ips, seen
}

func (c *cluster) podNames(ctx context.Context, sel string) []string {
	names, _, _ := c.readyPods(ctx, sel)
	return names
}

func (c *cluster) waitEngines(ctx context.Context, n int) {
	c.t.Helper()
	c.waitFor(ctx, fmt.Sprintf("%d engine Pods Ready", n), 2*time.Minute, func() (bool, string) {
		names, _, seen := c.readyPods(ctx, engineSel)
		return len(names) == n, seen
	})
}

// waitRouters waits for n router Pods Ready and returns their IPs.
func (c *cluster) waitRouters(ctx context.Context, n int, within time.Duration) []string {
	c.t.Helper()
	var ips []string
	c.waitFor(ctx, fmt.Sprintf("%d router Pods Ready", n), within, func() (bool, string) {
		var names []string
		var seen string
		names, ips, seen = c.readyPods(ctx, routerSel)
		return len(names) == n, seen
	})
	return ips
}

// waitRoutable waits until every router routes to exactly the Ready
// engine Pods, n of them (admitted and up in its /metrics), and returns
// their names.
func (c *cluster) waitRoutable(ctx context.Context, routers []string, n int, within time.Duration) []string {
	c.t.Helper()
	var engines []string
	c.waitFor(ctx, fmt.Sprintf("%d engines routable on every router", n), within, func() (bool, string) {
		engines = c.podNames(ctx, engineSel)
		seen := fmt.Sprintf("engine Pods Ready %v;", engines)
		if len(engines) != n {
			return false, seen
		}
		for _, ip := range routers {
			r := c.metrics(ctx, ip).routable()
			seen += fmt.Sprintf(" router %s routes %v;", ip, r)
			if fmt.Sprint(r) != fmt.Sprint(engines) {
				return false, seen
			}
		}
		return true, seen
	})
	return engines
}

// result is one request's outcome.
type result struct {
	status  int
	replica string
	done    bool // a stream ended with [DONE]
	err     error
}

// complete sends a /v1/completions request to a router Pod.
func (c *cluster) complete(ctx context.Context, ip, prompt string, maxTokens int) result {
	return c.request(ctx, ip, prompt, maxTokens, false, nil)
}

// request sends a completion; with stream, started is closed once the
// first chunk arrived, and done says whether [DONE] ended the stream.
func (c *cluster) request(ctx context.Context, ip, prompt string, maxTokens int, stream bool, started chan<- string) result {
	body, _ := json.Marshal(map[string]any{"model": model, "prompt": prompt, "max_tokens": maxTokens, "stream": stream})
	rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(rctx, http.MethodPost, "http://"+ip+":8080/v1/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return result{err: err}
	}
	defer resp.Body.Close()
	r := result{status: resp.StatusCode, replica: resp.Header.Get("X-Kvrouter-Replica")}
	if !stream || resp.StatusCode != 200 {
		b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		if resp.StatusCode != 200 {
			r.err = fmt.Errorf("%s", b)
		} else {
			r.err = err
		}
		return r
	}
	sc := bufio.NewScanner(resp.Body)
	first := true
	for sc.Scan() {
		line := sc.Text()
		if first && strings.HasPrefix(line, "data: ") && started != nil {
			started <- r.replica
			first = false
		}
		if line == "data: [DONE]" {
			r.done = true
		}
	}
	r.err = sc.Err()
	return r
}

// metrics is a scrape of a router's /metrics.
type metrics string

func (c *cluster) metrics(ctx context.Context, ip string) metrics {
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(rctx, http.MethodGet, "http://"+ip+":8080/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return metrics("error: " + err.Error())
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	return metrics(b)
}

// samples returns the lines of a metric: labels (the text between the
// braces) and value.
func (m metrics) samples(name string) map[string]string {
	out := map[string]string{}
	for _, l := range strings.Split(string(m), "\n") {
		if !strings.HasPrefix(l, name+"{") && !strings.HasPrefix(l, name+" ") {
			continue
		}
		i := strings.LastIndexByte(l, ' ')
		out[strings.TrimPrefix(l[:i], name)] = l[i+1:]
	}
	return out
}

func (m metrics) values(name string) []string {
	var v []string
	for _, x := range m.samples(name) {
		v = append(v, x)
	}
	sort.Strings(v)
	return v
}

func (m metrics) has(name, value string) bool { return contains(m.values(name), value) }

// routable lists the endpoints admitted and up, sorted.
func (m metrics) routable() []string {
	up := m.samples("kvrouter_fleet_endpoint_up")
	var out []string
	for labels, v := range m.samples("kvrouter_fleet_endpoint_admitted") {
		if v == "1" && up[labels] == "1" {
			out = append(out, labelValue(labels, "endpoint"))
		}
	}
	sort.Strings(out)
	return out
}

// labelValue reads label name from `{a="x",b="y"}`.
func labelValue(labels, name string) string {
	i := strings.Index(labels, name+`="`)
	if i < 0 {
		return ""
	}
	rest := labels[i+len(name)+2:]
	return rest[:strings.IndexByte(rest, '"')]
}

// deleteUnderLoad starts streams on both engines, deletes an engine Pod
// that has some, and checks that every stream finishes with [DONE] while
// new requests go to the other engine.
func (c *cluster) deleteUnderLoad(ctx context.Context, routers []string) {
	t := c.t
	const streams = 6
	started := make(chan string, streams)
	results := make(chan result, streams)
	for i := range streams {
		go func() {
			results <- c.request(ctx, routers[i%2], fmt.Sprintf("drain stream %d %d", i, time.Now().UnixNano()), 1000, true, started)
		}()
	}
	on := map[string]int{}
	for range streams {
		select {
		case rep := <-started:
			on[rep]++
		case r := <-results:
			t.Fatalf("a stream ended before all had started: status %d, %v", r.status, r.err)
		case <-time.After(60 * time.Second):
			t.Fatalf("streams not started after 60 s (started on %v)", on)
		}
	}
	var victim string
	for rep, k := range on {
		if victim == "" || k > on[victim] {
			victim = rep
		}
	}
	t0 := time.Now()
	if err := c.cs.CoreV1().Pods(ns).Delete(ctx, victim, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// While it drains, new requests go elsewhere.
	c.waitFor(ctx, "the deleted engine out of every router's routing", 30*time.Second, func() (bool, string) {
		seen := ""
		for _, ip := range routers {
			r := c.metrics(ctx, ip).routable()
			seen += fmt.Sprintf(" %s: %v", ip, r)
			if contains(r, victim) {
				return false, seen
			}
		}
		return true, seen
	})
	out := time.Since(t0)
	for i := range 6 {
		r := c.complete(ctx, routers[i%2], fmt.Sprintf("while draining %d", i), 4)
		if r.err != nil || r.status != 200 || r.replica == victim {
			t.Fatalf("request %d while %s drains: status %d replica %q (%v)", i, victim, r.status, r.replica, r.err)
		}
	}
	var cut []string
	for range streams {
		r := <-results
		if r.status != 200 || !r.done {
			cut = append(cut, fmt.Sprintf("%s: status %d done=%v err=%v", r.replica, r.status, r.done, r.err))
		}
	}
	if len(cut) > 0 {
		t.Fatalf("streams cut when %s was deleted with %d of %d streams on it: %v", victim, on[victim], streams, cut)
	}
	t.Logf("RESULT engine Pod %s deleted with %d streams in flight on it (%d in all): all %d ended with [DONE]; out of routing %.2f s after the delete call, streams done %.2f s after it",
		victim, on[victim], streams, streams, out.Seconds(), time.Since(t0).Seconds())
	c.waitRoutable(ctx, routers, 2, 2*time.Minute)
}

// load sends requests from workers goroutines until stop is closed, each
// to a router chosen from pick; it counts successes and failures.
type load struct {
	ok, failed atomic.Int64
	mu         sync.Mutex
	failures   []string
	wg         sync.WaitGroup
	stop       chan struct{}
}

func (c *cluster) startLoad(ctx context.Context, workers int, pick func(i int) string) *load {
	l := &load{stop: make(chan struct{})}
	for w := range workers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for i := 0; ; i++ {
				select {
				case <-l.stop:
					return
				default:
				}
				ip := pick(w + i)
				r := c.request(ctx, ip, fmt.Sprintf("load %d %d", w, i), 8, w%2 == 0, nil)
				if r.err == nil && r.status == 200 && (w%2 != 0 || r.done) {
					l.ok.Add(1)
					continue
				}
				l.failed.Add(1)
				l.mu.Lock()
				if len(l.failures) < 10 {
					l.failures = append(l.failures, fmt.Sprintf("%s: status %d done=%v %v", ip, r.status, r.done, r.err))
				}
				l.mu.Unlock()
			}
		}()
	}
	return l
}

func (l *load) end() { close(l.stop); l.wg.Wait() }

// rollingUpdate changes the router Deployment's Pod template with helm
// upgrade under load; clients pick among the router Pods that are Ready
// and not terminating, refreshed every 100 ms, as a Service's endpoints
// would give them.
func (c *cluster) rollingUpdate(ctx context.Context, helm, values string) {
	t := c.t
	var mu sync.Mutex
	_, ips, _ := c.readyPods(ctx, routerSel)
	stopWatch := make(chan struct{})
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		for {
			select {
			case <-stopWatch:
				return
			case <-time.After(100 * time.Millisecond):
			}
			if _, cur, _ := c.readyPods(ctx, routerSel); len(cur) > 0 {
				mu.Lock()
				ips = cur
				mu.Unlock()
			}
		}
	}()
	defer func() { close(stopWatch); <-watchDone }()
	l := c.startLoad(ctx, 4, func(i int) string { mu.Lock(); defer mu.Unlock(); return ips[i%len(ips)] })
	before, _, _ := c.readyPods(ctx, routerSel)
	t0 := time.Now()
	if out, err := exec.CommandContext(ctx, helm, "upgrade", release, "../../deploy/helm/kvrouter", "--namespace", ns,
		"--kubeconfig", c.node.Kubeconfig(), "--values", values, "--set-string", "podAnnotations.rollout=2").CombinedOutput(); err != nil {
		l.end()
		t.Fatalf("helm upgrade: %v\n%s", err, out)
	}
	c.waitFor(ctx, "the rolling update done (2 new router Pods Ready, the old ones gone)", 3*time.Minute, func() (bool, string) {
		pods, err := c.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: routerSel})
		if err != nil {
			return false, err.Error()
		}
		names, _, seen := c.readyPods(ctx, routerSel)
		return len(pods.Items) == 2 && len(names) == 2 && !contains(before, names[0]) && !contains(before, names[1]), seen
	})
	took := time.Since(t0)
	l.end()
	if l.failed.Load() > 0 || l.ok.Load() == 0 {
		t.Fatalf("rolling update of the routers: %d ok, %d failed: %v", l.ok.Load(), l.failed.Load(), l.failures)
	}
	t.Logf("RESULT rolling update of the router Deployment: %d requests ok, 0 failed, in %.1f s", l.ok.Load(), took.Seconds())
}

// apiServerRestart stops kube-apiserver under load, keeps serving while it
// is down, starts it again and times how long a change made then (engines
// scaled 2 -> 3) takes to be routable.
func (c *cluster) apiServerRestart(ctx context.Context) {
	t := c.t
	_, routers, _ := c.readyPods(ctx, routerSel)
	if len(routers) != 2 {
		t.Fatalf("want 2 router Pods before the restart, have %v", routers)
	}
	before := c.podNames(ctx, engineSel)
	l := c.startLoad(ctx, 4, func(i int) string { return routers[i%2] })
	c.node.StopAPIServer()
	down := time.Now()
	// Serve a while without it: 100 requests answered after the stop.
	base := l.ok.Load()
	c.waitFor(ctx, "100 requests served while kube-apiserver is down", 60*time.Second, func() (bool, string) {
		return l.ok.Load()-base >= 100, fmt.Sprintf("%d ok, %d failed", l.ok.Load()-base, l.failed.Load())
	})
	during := l.ok.Load() - base
	if err := c.node.StartAPIServer(); err != nil {
		l.end()
		t.Fatal(err)
	}
	back := time.Now()
	c.scaleEngines(ctx, 3)
	added := c.waitRoutable(ctx, routers, 3, 2*time.Minute)
	catchUp := time.Since(back)
	l.end()
	if l.failed.Load() > 0 {
		t.Fatalf("kube-apiserver restart: %d ok, %d failed: %v", l.ok.Load(), l.failed.Load(), l.failures)
	}
	t.Logf("RESULT kube-apiserver down %.1f s: %d requests served meanwhile, %d ok and 0 failed in all; engines scaled 2 -> 3 right after it was ready again: routable %.2f s later (%v, before %v)",
		back.Sub(down).Seconds(), during, l.ok.Load(), catchUp.Seconds(), added, before)
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) && len(out) < 5 {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
