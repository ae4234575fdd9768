package e2e

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"kvrouter/internal/bench"
	"kvrouter/internal/bench/report"
	"kvrouter/internal/workload"
)

// lbRouterProc is "kvrouter serve" run as a process, so that a test can kill
// it outright (SIGKILL: no drain).
type lbRouterProc struct {
	url  string
	cmd  *exec.Cmd
	done chan struct{}
}

func startRouterProc(t *testing.T, bin, yaml string) *lbRouterProc {
	t.Helper()
	port := e2eFreePort(t)
	cfgPath := filepath.Join(t.TempDir(), "router.yaml")
	if err := os.WriteFile(cfgPath, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "serve", "--config", cfgPath, "--listen", fmt.Sprintf("127.0.0.1:%d", port), "--log-level", "warn")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := &lbRouterProc{url: fmt.Sprintf("http://127.0.0.1:%d", port), cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(r.done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-r.done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-r.done
		}
	})
	e2eEventually(t, 30*time.Second, "router process ready", func() bool {
		resp, err := http.Get(r.url + "/ready?full=1")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	return r
}

// startHAProxy runs Debian's haproxy in the foreground with one round-robin
// frontend per backend list, checking /ready every 200ms (a refused
// connection marks a router down at once; an answer may take 2 s, as a
// loaded machine's can), retrying (on
// another server) only requests whose connection could not be made. Each
// request gets its own server connection (http-server-close, no reuse), so
// the connections open to a router are the requests in flight on it.
func startHAProxy(t *testing.T, fronts ...[]*lbRouterProc) []string {
	t.Helper()
	bin, err := exec.LookPath("haproxy")
	if err != nil {
		// Debian's package puts it in /usr/sbin, which not every PATH has.
		if _, serr := os.Stat("/usr/sbin/haproxy"); serr == nil {
			bin, err = "/usr/sbin/haproxy", nil
		}
	}
	if err != nil {
		if os.Getenv("KVROUTER_K8S_REQUIRED") == "1" {
			t.Fatal("haproxy not found: Debian's haproxy (tools/setup/setup.sh test installs it)")
		}
		t.Skip("haproxy not found (tools/setup/setup.sh test installs Debian's haproxy)")
	}
	var b strings.Builder
	b.WriteString("global\n  maxconn 4096\ndefaults\n  mode http\n  timeout connect 1s\n  timeout client 120s\n  timeout server 120s\n  timeout check 2s\n  retries 3\n  option redispatch 1\n  retry-on conn-failure\n  option http-no-delay\n  option http-server-close\n  http-reuse never\n")
	var urls []string
	for i, backends := range fronts {
		port := e2eFreePort(t)
		urls = append(urls, fmt.Sprintf("http://127.0.0.1:%d", port))
		fmt.Fprintf(&b, "frontend f%d\n  bind 127.0.0.1:%d\n  default_backend b%d\nbackend b%d\n  balance roundrobin\n  option httpchk GET /ready\n", i, port, i, i)
		for j, r := range backends {
			fmt.Fprintf(&b, "  server r%d %s check inter 200ms fall 1 rise 2\n", j, strings.TrimPrefix(r.url, "http://"))
		}
	}
	cfg := filepath.Join(t.TempDir(), "haproxy.cfg")
	if err := os.WriteFile(cfg, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-db", "-f", cfg)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	for _, u := range urls {
		e2eEventually(t, 10*time.Second, "haproxy frontend up", func() bool {
			resp, err := http.Get(u + "/ready")
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == 200
		})
	}
	return urls
}

// establishedTo counts the established TCP connections to the port of
// base (IPv4 loopback), from /proc/net/tcp.
func establishedTo(t *testing.T, base string) int {
	t.Helper()
	port, err := strconv.Atoi(base[strings.LastIndexByte(base, ':')+1:])
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf(":%04X", port)
	n := 0
	for _, line := range strings.Split(string(data), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) > 3 && strings.HasSuffix(f[1], want) && f[3] == "01" {
			n++
		}
	}
	return n
}

// hitFrom is the prefix cache hit rate (cached / prompt tokens) of the
// successful requests of run from sample index i on.
func hitFrom(run *report.Run, i int) float64 {
	var cached, prompt int
	for _, s := range run.Samples[i:] {
		if s.Err == "" {
			cached += s.CachedTokens
			prompt += s.PromptTokens
		}
	}
	return float64(cached) / float64(max(prompt, 1))
}

// TestE2EReplicasBehindHAProxy: three engine-sim processes; one kvrouter
// serve process, then two and three of them behind a real HAProxy
// (round-robin), replay the same Mooncake slice (prefix caches reset before
// each run). In the three-replica run one router process is killed
// (SIGKILL) mid-run: the only failed requests are those it had in flight,
// and the other two keep the hit rate the two-replica run had on the same
// requests.
func TestE2EReplicasBehindHAProxy(t *testing.T) {
	if testing.Short() {
		t.Skip("starts engine-sim, kvrouter and haproxy processes")
	}
	bin := e2eBuild(t)
	var sims []*e2eSim
	var engines []string
	for range 3 {
		s := startSnapSim(t, bin, 10000, 4096)
		sims = append(sims, s)
		engines = append(engines, s.url)
	}
	var y strings.Builder
	y.WriteString("health: {probe_interval: 200ms, scrape_interval: 200ms}\nmodels:\n  - name: m\n    tokenizer: none\n    engines:\n")
	for i, s := range sims {
		fmt.Fprintf(&y, "      - {name: e%d, url: %q, events: %q, replay: %q}\n", i, s.url, s.events, s.replay)
	}
	var routers []*lbRouterProc
	for range 3 {
		routers = append(routers, startRouterProc(t, bin, y.String()))
	}
	fronts := startHAProxy(t, routers[:2], routers)

	wf := workload.Spec{Kind: "mooncake", Requests: 160, MaxInput: 3000, MaxOutput: 64, Rate: 30, Seed: 1}
	w, err := wf.Build(mooncakeTrace(t))
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	runOne := func(name, url string) *report.Run {
		t.Helper()
		run, err := bench.Run(t.Context(), bench.Config{Name: name, Targets: []string{url}, Policy: bench.PolicyRouter,
			Model: "m", Metrics: engines, Reset: true, Timeout: time.Minute, MaxInFlight: 1024, Seed: 1}, w, nil, log)
		if err != nil {
			t.Fatal(err)
		}
		return run
	}
	single := runOne("1 router", routers[0].url)
	two := runOne("2 routers (haproxy)", fronts[0])

	// The three-replica run, killing router 2 at 40% of the arrivals.
	victim := routers[2]
	killAt := w.Requests[len(w.Requests)*2/5].At
	inflight := make(chan float64, 1)
	// killed is when SIGKILL was sent, from about the run's start (before
	// it: the run's set-up comes first): on a loaded machine the sleep
	// ends late, or the goroutine is descheduled while the router is
	// frozen, and HAProxy sends it requests until the kill.
	var killed time.Duration
	runStart := time.Now()
	go func() {
		time.Sleep(killAt) // at that point of the trace: pacing the kill to the replay
		// Frozen, it takes no request off its sockets; what HAProxy has
		// sent it is in flight on it: one connection each (plus at most
		// one health check).
		_ = victim.cmd.Process.Signal(syscall.SIGSTOP)
		n := establishedTo(t, victim.url)
		_ = victim.cmd.Process.Signal(syscall.SIGKILL)
		killed = time.Since(runStart)
		inflight <- float64(n)
	}()
	three := runOne("3 routers (haproxy), one killed", fronts[1])
	lost := <-inflight

	slo := report.SLO{TTFT: 2 * time.Second, ITL: 100 * time.Millisecond}
	rep := report.New("replicas behind haproxy: mooncake slice", w.Info(), []*report.Run{single, two, three}, slo)
	var md strings.Builder
	if err := rep.Markdown(&md); err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", md.String())

	errs := func(r *report.Run) int {
		n := 0
		for _, s := range r.Samples {
			if s.Err != "" {
				n++
			}
		}
		return n
	}
	if errs(single) != 0 || errs(two) != 0 {
		var first []string
		for _, r := range []*report.Run{single, two} {
			for _, x := range r.Samples {
				if x.Err != "" && len(first) < 3 {
					first = append(first, x.Err)
				}
			}
		}
		t.Fatalf("failed requests: %d with one router, %d with two; first errors: %q", errs(single), errs(two), first)
	}
	// Only requests that reached the killed router before HAProxy's next
	// health check (inter 200ms, fall 1) may fail: those in flight on it
	// (counted while frozen; connections the kernel accepted for it after
	// the count are not seen, so the count is a floor, logged) and those
	// HAProxy sent it before marking it down. None that arrived later.
	var late []string
	killAt = max(killAt, killed) // killed is set before the send on inflight
	for _, smp := range three.Samples {
		if smp.Err != "" && smp.Arrival > killAt+300*time.Millisecond {
			late = append(late, fmt.Sprintf("%s at %v: %s", smp.ID, smp.Arrival, smp.Err))
		}
	}
	t.Logf("three-replica run: %d failed, %v connections open on the killed router when frozen", errs(three), lost)
	if len(late) > 0 || errs(three) > 8 {
		t.Fatalf("%d requests failed in the three-replica run (killed at %v, %v in flight on it); after the kill's detection window: %v", errs(three), killAt, lost, late)
	}
	// Requests arriving a second after the kill on: the survivors' hit rate
	// against the two-replica run's on the same requests.
	after := len(w.Requests)
	for i, r := range w.Requests {
		if r.At > killAt+time.Second {
			after = i
			break
		}
	}
	h2, h3 := hitFrom(two, after), hitFrom(three, after)
	t.Logf("killed router had %v connections open (requests in flight); %d failed; hit rate from request %d on: two routers %.3f, survivors %.3f; whole runs: one %.3f, two %.3f, three %.3f",
		lost, errs(three), after, h2, h3, hitFrom(single, 0), hitFrom(two, 0), hitFrom(three, 0))
	if h3 < 0.9*h2 {
		t.Fatalf("survivors' hit rate %.3f below 0.9 x the two-replica run's %.3f", h3, h2)
	}
	if hs := hitFrom(single, 0); hitFrom(two, 0) < 0.9*hs {
		t.Fatalf("two replicas' hit rate %.3f below 0.9 x one router's %.3f", hitFrom(two, 0), hs)
	}
}

// mooncakeTrace reads the Mooncake conversation trace the binary embeds
// (testdata/mooncake).
func mooncakeTrace(t *testing.T) []workload.TraceRecord {
	t.Helper()
	f, err := os.Open(filepath.Join("..", "..", "testdata", "mooncake", "conversation_trace.jsonl.gz"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	recs, err := workload.ReadTrace(f)
	if err != nil {
		t.Fatal(err)
	}
	return recs
}
