package discovery

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kvrouter/internal/config"
	"kvrouter/internal/k8stest"
)

// logBuffer is a bytes.Buffer safe for the informer's and the test's
// goroutines.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestPeersOwnPodUnmatched: when the selector misses this replica's own
// Pod (its labels differ), Peers warns once after the first list, naming
// what it matched, and routes as one router; a replica whose Pod matches
// logs the list at info and no warning. The own-Pod check runs once, so
// later events (a matched Pod going not Ready and Ready again, seen by the
// matched replica) add no second warning.
func TestPeersOwnPodUnmatched(t *testing.T) {
	c := k8stest.Start(t, k8stest.Options{})
	e := newEnv(t, c, "routers-own")
	sel := map[string]string{"app.kubernetes.io/name": "kvrouter", "app.kubernetes.io/instance": "r"}
	e.pod(t, "kvrouter-a", "192.0.2.1", map[string]string{"app.kubernetes.io/name": "kvrouter", "app.kubernetes.io/instance": "renamed"}, nil, true)
	e.pod(t, "kvrouter-b", "192.0.2.2", sel, nil, true)
	e.pod(t, "kvrouter-c", "192.0.2.3", sel, nil, true)

	logs := map[string]*logBuffer{}
	places := map[string]*Peers{}
	for _, name := range []string{"kvrouter-a", "kvrouter-b"} {
		lb := &logBuffer{}
		p, err := NewPeers(config.Peers{Namespace: e.ns, Selector: "app.kubernetes.io/name=kvrouter,app.kubernetes.io/instance=r", PodName: name},
			c.Config(), func(int, int) {}, slog.New(slog.NewTextHandler(lb, nil)))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- p.Run(ctx) }()
		t.Cleanup(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Error("Run did not return 10 s after its context ended")
			}
		})
		logs[name], places[name] = lb, p
	}
	waitLog := func(name, want string) string {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if s := logs[name].String(); strings.Contains(s, want) {
				return s
			}
		}
		t.Fatalf("%s: no %q in 30 s; log:\n%s", name, want, logs[name])
		return ""
	}
	const warn = "level=WARN msg=\"own Pod not among the router Pods the peers selector matches; routing as one router (no stripes) until it is: check peers.selector against the Pod's labels, peers.namespace and pod_name (POD_NAME)\""
	got := waitLog("kvrouter-a", warn)
	if !strings.Contains(got, "pod=kvrouter-a matched=2 matched_pods=\"[kvrouter-b kvrouter-c]\"") {
		t.Errorf("warning lacks the Pod and what matched:\n%s", got)
	}
	if b := waitLog("kvrouter-b", `msg="router Pods listed"`); strings.Contains(b, "WARN") || !strings.Contains(b, "matched=2") {
		t.Errorf("kvrouter-b, whose Pod matches:\n%s", b)
	}
	// More events: kvrouter-c not Ready, then Ready again, followed by b.
	for _, ready := range []bool{false, true} {
		p, err := e.cs.CoreV1().Pods(e.ns).Get(e.ctx, "kvrouter-c", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		e.podStatus(t, p, p.Status.PodIP, ready)
		want := [2]int{1, 0}
		if ready {
			want = [2]int{2, 0}
		}
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if n, i := places["kvrouter-b"].Place(); [2]int{n, i} == want {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("kvrouter-b's place did not reach %v", want)
			}
		}
	}
	if n := strings.Count(logs["kvrouter-a"].String(), "own Pod not among"); n != 1 {
		t.Errorf("%d warnings, want 1:\n%s", n, logs["kvrouter-a"])
	}
	if n, i := places["kvrouter-a"].Place(); n != 1 || i != 0 {
		t.Errorf("unmatched replica's place %d, %d, want 1, 0", n, i)
	}
}
