package e2e

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"kvrouter/internal/k8stest"
)

// TestServePeers runs two serve replicas with router.yaml's peers block
// against a real kube-apiserver, the test playing the kubelet for their
// Pods: each replica's router (its /metrics, read from the router itself)
// is one router until its Pod is Ready, then (2, 0) and (2, 1) by Pod
// name, and the survivor is (1, 0) again within 1 s of its sibling's
// Pod being deleted.
func TestServePeers(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts a kube-apiserver")
	}
	c := k8stest.Start(t, k8stest.Options{})
	ctx := t.Context()
	const ns = "routers"
	if err := c.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	cs := kubernetes.NewForConfigOrDie(c.Config())
	rc := c.Config()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	kc := fmt.Sprintf("apiVersion: v1\nkind: Config\nclusters: [{name: t, cluster: {server: %q, certificate-authority: %q}}]\n"+
		"users: [{name: a, user: {token: %q}}]\ncontexts: [{name: t, context: {cluster: t, user: a}}]\ncurrent-context: t\n",
		rc.Host, rc.CAFile, rc.BearerToken)
	if err := os.WriteFile(kubeconfig, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	names := []string{"kvr-kvrouter-b", "kvr-kvrouter-a"} // replica 0's Pod sorts second
	var rs []*e2eRouter
	for _, name := range names {
		rs = append(rs, serveYAML(t, fmt.Sprintf(`health: {probe_interval: -1s, scrape_interval: -1s}
peers: {namespace: %s, selector: app=kvrouter, pod_name: %s, kubeconfig: %q}
models:
  - name: m
    tokenizer: none
    engines: [{url: 'http://127.0.0.1:9'}, {url: 'http://127.0.0.1:10'}]
`, ns, name, kubeconfig), 0))
	}
	gauge := regexp.MustCompile(`(?m)^kvrouter_discovery_peers_(routers|index)\{model="m"\} (\d+)$`)
	place := func(r *e2eRouter) string {
		t.Helper()
		resp, err := r.client.Get(r.url + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		got := map[string]string{}
		for _, m := range gauge.FindAllStringSubmatch(string(b), -1) {
			got[m[1]] = m[2]
		}
		return got["routers"] + "," + got["index"]
	}
	wait := func(what string, since time.Time, want ...string) {
		t.Helper()
		for {
			ok := true
			var got []string
			for k, r := range rs {
				got = append(got, place(r))
				ok = ok && got[k] == want[k]
			}
			if ok {
				t.Logf("%s: %v after %v", what, got, time.Since(since).Round(time.Millisecond))
				return
			}
			if time.Since(since) > time.Second {
				t.Fatalf("%s: places %v after 1 s, want %v", what, got, want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	wait("no Pods", time.Now(), "1,0", "1,0")
	for k, name := range names {
		at := time.Now()
		p, err := cs.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": "kvrouter"}},
			Spec:       corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{Name: "kvrouter", Image: "kvrouter"}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		p.Status = corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
		if _, err := cs.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		if k == 0 {
			wait("first Pod Ready", at, "1,0", "1,0")
		} else {
			wait("both Ready", at, "2,1", "2,0")
		}
	}
	at := time.Now()
	if err := cs.CoreV1().Pods(ns).Delete(ctx, names[1], metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	wait("sibling deleted", at, "1,0", "1,0")
}
