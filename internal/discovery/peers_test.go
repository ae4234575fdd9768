package discovery

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"kvrouter/internal/config"
	"kvrouter/internal/k8stest"
	"kvrouter/internal/testwait"
)

// peerRun is a Peers whose Run goroutine the test owns, recording every
// place it was given.
type peerRun struct {
	p    *Peers
	mu   sync.Mutex
	got  [][2]int
	done chan error
}

func startPeers(t *testing.T, rc *rest.Config, cfg config.Peers) *peerRun {
	t.Helper()
	r := &peerRun{done: make(chan error, 1)}
	log := slog.New(slog.NewTextHandler(t.Output(), nil))
	p, err := NewPeers(cfg, rc, func(n, i int) {
		r.mu.Lock()
		r.got = append(r.got, [2]int{n, i})
		r.mu.Unlock()
	}, log)
	if err != nil {
		t.Fatal(err)
	}
	r.p = p
	ctx, cancel := context.WithCancel(context.Background())
	go func() { r.done <- p.Run(ctx) }()
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

// last is the place set was last given ((1, 0) before any).
func (r *peerRun) last() [2]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.got) == 0 {
		return [2]int{1, 0}
	}
	return r.got[len(r.got)-1]
}

// waitPlaces checks that every replica's place reaches want within
// testwait.Default (polled every 5 ms) and stays there 200 ms, and logs
// the time taken (about 1 s or less on a quiet machine: a deadline, not
// the goal, which a loaded machine's API server can miss).
func waitPlaces(t *testing.T, what string, rs []*peerRun, want [][2]int) {
	t.Helper()
	waitPlacesSince(t, time.Now(), what, rs, want)
}

// waitPlacesSince is waitPlaces timed from start (before the change).
func waitPlacesSince(t *testing.T, start time.Time, what string, rs []*peerRun, want [][2]int) {
	t.Helper()
	for time.Since(start) < testwait.Default {
		ok := true
		for k, r := range rs {
			ok = ok && r.last() == want[k]
		}
		if ok {
			took := time.Since(start)
			time.Sleep(200 * time.Millisecond) // absence: no replica moves on from want
			for k, r := range rs {
				if r.last() != want[k] {
					t.Fatalf("%s: replica %d moved on to %v", what, k, r.last())
				}
				if n, i := r.p.Place(); [2]int{n, i} != want[k] {
					t.Fatalf("%s: replica %d Place() = %d, %d, set got %v", what, k, n, i, want[k])
				}
			}
			t.Logf("%s: places %v after %v", what, want, took.Round(time.Millisecond))
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	var got [][2]int
	for _, r := range rs {
		got = append(got, r.last())
	}
	t.Fatalf("%s: places %v after %v, want %v", what, got, testwait.Default, want)
}

// TestPeers runs three router replicas' Peers against a real kube-apiserver
// while the test plays the kubelet: the router Pods (kvrouter-c,
// kvrouter-a, kvrouter-b, created in that order) are created not Ready,
// made Ready one by one, deleted (graceful: terminating) and removed.
// Each replica's (routers, index) follows (each change logged with the
// time it took): (1, 0) until its own
// Pod is Ready, then its place in name order among the Ready ones, all
// indices distinct; a Pod outside the selector or not Ready counts for
// nothing; a terminating one drops out and the others close up.
func TestPeers(t *testing.T) {
	c := k8stest.Start(t, k8stest.Options{})
	e := newEnv(t, c, "routers")
	sel := map[string]string{"app.kubernetes.io/name": "kvrouter", "app.kubernetes.io/instance": "r"}
	names := []string{"kvrouter-a", "kvrouter-b", "kvrouter-c"}
	var rs []*peerRun
	for _, n := range names {
		rs = append(rs, startPeers(t, c.Config(), config.Peers{Namespace: e.ns,
			Selector: "app.kubernetes.io/name=kvrouter,app.kubernetes.io/instance=r", PodName: n}))
	}
	one := [][2]int{{1, 0}, {1, 0}, {1, 0}}
	waitPlaces(t, "no Pods", rs, one)
	for k, n := range []string{"kvrouter-c", "kvrouter-a", "kvrouter-b"} {
		e.pod(t, n, fmt.Sprintf("192.0.2.%d", k+1), sel, nil, false)
	}
	e.pod(t, "kvrouter-0-other", "192.0.2.9", map[string]string{"app.kubernetes.io/name": "kvrouter", "app.kubernetes.io/instance": "other"}, nil, true)
	waitPlaces(t, "none Ready", rs, one)

	var at time.Time
	ready := func(name string, ok bool) {
		t.Helper()
		at = time.Now()
		p, err := e.cs.CoreV1().Pods(e.ns).Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		e.podStatus(t, p, p.Status.PodIP, ok)
	}
	ready("kvrouter-c", true)
	waitPlacesSince(t, at, "c Ready", rs, [][2]int{{1, 0}, {1, 0}, {1, 0}})
	ready("kvrouter-a", true)
	waitPlacesSince(t, at, "a, c Ready", rs, [][2]int{{2, 0}, {1, 0}, {2, 1}})
	ready("kvrouter-b", true)
	waitPlacesSince(t, at, "all Ready", rs, [][2]int{{3, 0}, {3, 1}, {3, 2}})
	ready("kvrouter-a", false)
	waitPlacesSince(t, at, "a not Ready", rs, [][2]int{{1, 0}, {2, 0}, {2, 1}})
	ready("kvrouter-a", true)
	waitPlacesSince(t, at, "a Ready again", rs, [][2]int{{3, 0}, {3, 1}, {3, 2}})

	api := e.cs.CoreV1().Pods(e.ns)
	at = time.Now()
	if err := api.Delete(e.ctx, "kvrouter-b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPlacesSince(t, at, "b terminating", rs, [][2]int{{2, 0}, {1, 0}, {2, 1}})
	zero := int64(0)
	at = time.Now()
	if err := api.Delete(e.ctx, "kvrouter-a", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	waitPlacesSince(t, at, "a gone", rs, [][2]int{{1, 0}, {1, 0}, {1, 0}})
}

// TestPeersNoAPIServer: with nothing answering at the API server's
// address, Run neither blocks routing nor fails: the place stays (1, 0)
// and Run returns nil when its context ends. A config without selector,
// Pod name or namespace is refused, naming each.
func TestPeersNoAPIServer(t *testing.T) {
	r := startPeers(t, &rest.Config{Host: "http://127.0.0.1:1"}, config.Peers{Namespace: "ns", Selector: "app=kvrouter", PodName: "kvrouter-a"})
	time.Sleep(300 * time.Millisecond) // absence: nothing answers, so nothing may change the place
	if n, i := r.p.Place(); n != 1 || i != 0 {
		t.Errorf("Place() = %d, %d without an API server, want 1, 0", n, i)
	}
	_, err := NewPeers(config.Peers{Selector: "a in (", Resync: -1}, &rest.Config{Host: "http://127.0.0.1:1"}, func(int, int) {}, nil)
	for _, want := range []string{"namespace: required", "selector \"a in (\"", "pod_name: required", "resync -1ns"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not say %q", err, want)
		}
	}
}
