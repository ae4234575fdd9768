package e2e

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// routerProc is kvrouter serve as a process (a router Pod), on loopback.
type routerProc struct {
	url string
	cmd *exec.Cmd
}

// startRouterProc runs bin serve with the scenario's discovery and waits
// for /ready; it returns the router and how long it took to be ready.
func (s *k8sScenario) startRouterProc(bin, discovery string) (*routerProc, time.Duration) {
	s.t.Helper()
	port := e2eFreePort(s.t)
	cfg := filepath.Join(s.t.TempDir(), "router.yaml")
	yaml := fmt.Sprintf(`listen: "127.0.0.1:%d"
health: {probe_interval: 200ms, scrape_interval: 200ms}
models:
  - name: m
    tokenizer: none
    policy: round_robin
    discovery: {namespace: %s, kubeconfig: %q, %s}
`, port, s.ns, kubeconfigFile(s.t, s.c), discovery)
	if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
		s.t.Fatal(err)
	}
	t0 := time.Now()
	cmd := exec.Command(bin, "serve", "--config", cfg, "--log-level", "warn")
	if testing.Verbose() {
		cmd.Stderr = os.Stderr
	}
	if err := cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	p := &routerProc{url: fmt.Sprintf("http://127.0.0.1:%d", port), cmd: cmd}
	s.t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	e2eEventually(s.t, 60*time.Second, "router process ready", func() bool {
		resp, err := http.Get(p.url + "/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	return p, time.Since(t0)
}

// result is one client request of testRouterRestart.
type result struct {
	router  int // 1: the killed router, 2: its replacement
	start   time.Time
	ok      bool
	replica string
	failure string // what a failed request got: an error or a status and body
}

// testRouterRestart: clients send steadily (each request 100 ms at the
// engine) to router 1; it is killed (SIGKILL) and clients move to router
// 2, a new process, once it is ready, as a Service would. Only requests
// in flight on router 1 when it died fail; every request to router 2
// succeeds and both engines serve them; nothing stays in flight.
func testRouterRestart(t *testing.T, s *k8sScenario) {
	writeSlice(t, s.cs, s.ns, "vllm-a", s.ep("e0", true, true, false), s.ep("e1", true, true, false))
	bin := e2eBuild(t)
	r1, _ := s.startRouterProc(bin, "service: vllm")

	// cur is the router clients send to and its number, read in one load:
	// a request sent to router 1 is never counted as router 2's.
	type target struct {
		p  *routerProc
		id int
	}
	var cur atomic.Pointer[target]
	cur.Store(&target{r1, 1})
	var mu sync.Mutex
	var results []result
	stop := make(chan struct{})
	var wg sync.WaitGroup
	client := &http.Client{Timeout: 10 * time.Second}
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				// start is taken before the router is chosen: a request
				// that started after the kill was sent to router 2.
				start := time.Now()
				to := cur.Load()
				if to == nil { // no router ready
					time.Sleep(5 * time.Millisecond)
					continue
				}
				res := result{router: to.id, start: start}
				req, _ := http.NewRequest(http.MethodPost, to.p.url+"/v1/completions",
					strings.NewReader(fmt.Sprintf(`{"model":"m","prompt":[%d,%d,3,4],"max_tokens":2}`, w, i)))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("X-Test-Delay", "100ms")
				if resp, err := client.Do(req); err == nil {
					body, err := io.ReadAll(io.LimitReader(resp.Body, 512))
					resp.Body.Close()
					res.ok = err == nil && resp.StatusCode == 200
					res.replica = resp.Header.Get("X-Kvrouter-Replica")
					if !res.ok {
						res.failure = fmt.Sprintf("%d %q (%v)", resp.StatusCode, body, err)
					}
				} else {
					res.failure = err.Error()
				}
				mu.Lock()
				results = append(results, res)
				mu.Unlock()
			}
		})
	}
	// Router 1 answers some requests before it is killed.
	answered := func(router int, replica string) int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, r := range results {
			if r.router == router && r.ok && (replica == "" || r.replica == replica) {
				n++
			}
		}
		return n
	}
	e2eEventually(t, 30*time.Second, "router 1 answered 8 requests", func() bool { return answered(1, "") >= 8 })
	cur.Store(nil)
	killed := time.Now() // after: no request started later goes to router 1
	if err := r1.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = r1.cmd.Wait()
	r2, ready := s.startRouterProc(bin, "service: vllm")
	cur.Store(&target{r2, 2})
	// Router 2 picks up both engines (checked below).
	e2eEventually(t, 30*time.Second, "router 2 answered on e0 and e1", func() bool {
		return answered(2, "e0") > 0 && answered(2, "e1") > 0
	})
	close(stop)
	wg.Wait()

	var failed1, ok1, ok2 int
	var failures1 []string
	served2 := map[string]int{}
	for _, r := range results {
		switch {
		case r.router == 1 && r.ok:
			ok1++
		case r.router == 1:
			failed1++
			failures1 = append(failures1, fmt.Sprintf("sent %v before the kill: %s", killed.Sub(r.start).Round(time.Millisecond), r.failure))
			if r.start.After(killed) {
				t.Errorf("a request sent %v after router 1 was killed failed: %s", r.start.Sub(killed), r.failure)
			}
		case !r.ok:
			t.Errorf("a request to router 2 failed (sent %v after the kill): %s", r.start.Sub(killed), r.failure)
		default:
			ok2++
			served2[r.replica]++
		}
	}
	t.Logf("router 1: %d ok, %d failed (in flight when killed, at most 4); router 2 ready %v after its start, then %d ok by %v",
		ok1, failed1, ready.Round(time.Millisecond), ok2, served2)
	if failed1 > 4 || ok1 == 0 || ok2 == 0 {
		t.Errorf("router 1: %d ok, %d failed; router 2: %d ok; router 1's failures:\n%s", ok1, failed1, ok2, strings.Join(failures1, "\n"))
	}
	if served2["e0"] == 0 || served2["e1"] == 0 {
		t.Errorf("router 2 did not pick up both engines: %v", served2)
	}
	e2eEventually(t, 10*time.Second, "nothing in flight", func() bool {
		return s.sims["e0"].inFlight.Load() == 0 && s.sims["e1"].inFlight.Load() == 0 &&
			e2eMetric(t, r2.url, "kvrouter_proxy_in_flight_requests") == 0 &&
			e2eMetric(t, r2.url, "kvrouter_routing_in_flight_requests") == 0
	})
}
