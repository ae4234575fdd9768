package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"kvrouter/internal/config"
	"kvrouter/internal/enginesim"
	"kvrouter/internal/serve"
)

// End-to-end tests: engine-sims and kvrouter serve in this process, talking
// over real loopback sockets (HTTP and ZeroMQ), plus the openai npm client
// as a separate node process.

const e2eQwen3Dir = "../../testdata/tokenizer/qwen3"

// e2eSim is one simulated vLLM engine on loopback. In-process sims publish
// no KV events: zmq4 v0.17.0's PUB socket races with itself on Close once a
// subscriber has come and gone (socket.Close vs scheduleRmConn, seen with
// go test -race), so tests that need events run engine-sim processes
// (startE2ESimProcess).
type e2eSim struct {
	url, events, replay string
	stop                func()
}

type e2eSimOpt func(*enginesim.Config)

func e2eFaults(f enginesim.Faults) e2eSimOpt { return func(c *enginesim.Config) { c.Faults = f } }
func e2eProfile(p string) e2eSimOpt          { return func(c *enginesim.Config) { c.Core.Profile = p } }
func e2eMaxModelLen(n int) e2eSimOpt         { return func(c *enginesim.Config) { c.Core.MaxModelLen = n } }

// skipE2EShort skips t under -short (make check): end-to-end tests start
// engine-sims and routers, in this process or as processes, and take
// minutes together on two cores. make test runs them.
func skipE2EShort(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: end-to-end test (engine-sims and a router)")
	}
}

func startE2ESim(t *testing.T, opts ...e2eSimOpt) *e2eSim {
	t.Helper()
	skipE2EShort(t)
	cfg := enginesim.Config{
		Core:            enginesim.CoreConfig{Profile: enginesim.ProfileFast, MaxModelLen: 32768, NumGPUBlocks: 4096},
		ServedModelName: "m",
	}
	for _, o := range opts {
		o(&cfg)
	}
	srv, err := enginesim.New(cfg, nil, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	s := &e2eSim{url: "http://" + ln.Addr().String()}
	var once sync.Once
	s.stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("engine-sim: %v", err)
			}
		})
	}
	t.Cleanup(s.stop)
	return s
}

// e2eRouter is kvrouter serve on loopback.
type e2eRouter struct {
	t      *testing.T
	url    string
	client *http.Client
}

// waitFullyReady waits up to 60 s for the router's /ready?full=1 (every
// engine healthy and its KV events connected) to answer 200.
func (r *e2eRouter) waitFullyReady(t *testing.T) {
	t.Helper()
	e2eEventually(t, 60*time.Second, "router ready", func() bool {
		resp, err := r.client.Get(r.url + "/ready?full=1")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
}

// startE2ERouter runs serve with a router.yaml whose models[0] has the given
// extra lines and the sims as engines, and waits until every engine is
// ready (/ready?full=1).
func startE2ERouter(t *testing.T, modelYAML string, sims ...*e2eSim) *e2eRouter {
	t.Helper()
	return startE2ERouterWait(t, "/ready?full=1", modelYAML, sims...)
}

// serveYAML runs serve in-process on a loopback port with the router.yaml
// text and stops it when the test ends; logs go to stderr at level under -v.
func serveYAML(t *testing.T, yaml string, level slog.Level) *e2eRouter {
	t.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	}
	r := &e2eRouter{t: t, url: startServe(t, yaml, log), client: &http.Client{Transport: &http.Transport{}}}
	t.Cleanup(r.client.CloseIdleConnections)
	return r
}

// runServe runs internal/serve's App with o on ln until ctx ends, as
// kvrouter serve does (New, ListenAdmin, Run); it owns ln.
func runServe(ctx context.Context, o serve.Options, ln net.Listener) error {
	app, err := serve.New(ctx, o)
	if err != nil {
		ln.Close()
		return err
	}
	if _, err := app.ListenAdmin(); err != nil {
		ln.Close()
		app.Close()
		return err
	}
	return app.Run(ctx, ln)
}

// startServe runs serve in-process on a loopback port with the router.yaml
// text, logging to log, and stops it (checking it ended cleanly) when the
// test ends. It returns the base URL, https when the configuration has a
// certificate.
func startServe(t *testing.T, yaml string, log *slog.Logger) string {
	t.Helper()
	cfg, pos, err := config.Parse([]byte(yaml), func(string) string { return "" })
	if err != nil {
		t.Fatalf("%v\n%s", err, yaml)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- runServe(ctx, serve.Options{Config: cfg, Positions: pos, Log: log}, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	scheme := "http"
	if cfg.TLS.CertFile != "" {
		scheme = "https"
	}
	return scheme + "://" + ln.Addr().String()
}

// startE2ERouterWait is startE2ERouter waiting for readyPath to answer 200.
func startE2ERouterWait(t *testing.T, readyPath, modelYAML string, sims ...*e2eSim) *e2eRouter {
	t.Helper()
	var b strings.Builder
	b.WriteString("health: {probe_interval: 200ms, scrape_interval: 200ms, backoff_base: 30s, backoff_max: 60s}\nmodels:\n  - name: m\n")
	for l := range strings.Lines(modelYAML) {
		b.WriteString("    " + l)
	}
	b.WriteString("\n    engines:\n")
	for i, s := range sims {
		fmt.Fprintf(&b, "      - {name: e%d, url: %q", i, s.url)
		if s.events != "" {
			fmt.Fprintf(&b, ", events: %q, replay: %q", s.events, s.replay)
		}
		b.WriteString("}\n")
	}
	r := serveYAML(t, b.String(), slog.LevelWarn)
	// Stop the engines while the router is still subscribed: zmq4 v0.17.0
	// races (go test -race) when a PUB socket closes after a subscriber
	// left (socket.Close vs the reconnect in scheduleRmConn).
	t.Cleanup(func() {
		for _, s := range sims {
			s.stop()
		}
	})
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := r.client.Get(r.url + readyPath)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("router not ready within 60s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	return r
}

// post sends body and returns the response with its body read.
func (r *e2eRouter) post(path, body string, hdr ...string) (*http.Response, string) {
	r.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, r.url+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := r.client.Do(req)
	if err != nil {
		r.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		r.t.Fatalf("reading %s: %v", path, err)
	}
	return resp, string(b)
}

// metric returns the sum of the samples of name whose labels contain every
// given `key="value"` pair, from url's /metrics.
func e2eMetric(t *testing.T, url, name string, labels ...string) float64 {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
next:
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		for _, l := range labels {
			if !strings.Contains(line, l) {
				continue next
			}
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err == nil {
			sum += v
		}
	}
	return sum
}

func e2eEventually(t *testing.T, within time.Duration, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func e2eLeakCheck(t *testing.T) {
	opts := []goleak.Option{goleak.IgnoreCurrent(),
		// zmq4 v0.17.0's PUB socket (the engine-sim's publisher) leaves this
		// writer goroutine behind after Close.
		goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run")}
	t.Cleanup(func() { goleak.VerifyNone(t, opts...) })
}

func e2eChat(msgs ...string) string {
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	var m []msg
	for i, c := range msgs {
		role := "user"
		switch {
		case i == 0:
			role = "system"
		case i%2 == 0:
			role = "assistant"
		}
		m = append(m, msg{role, c})
	}
	b, _ := json.Marshal(map[string]any{"model": "m", "max_tokens": 4, "messages": m})
	return string(b)
}

// e2eFreePort returns a loopback TCP port that was free a moment ago,
// outside the kernel's ephemeral range (pickPort).
func e2eFreePort(t *testing.T) int {
	t.Helper()
	return pickPort(t)
}

// e2eBuild returns the path of the kvrouter binary, built once per test
// binary (kvrouterBin).
func e2eBuild(t *testing.T) string {
	t.Helper()
	skipE2EShort(t)
	bin, err := kvrouterBin()
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// startE2ESimProcess runs "kvrouter engine-sim" as a process with the Qwen3
// tokenizer and KV events (PUB bound on a free port, replay on another).
func startE2ESimProcess(t *testing.T, bin string) *e2eSim {
	t.Helper()
	ev, rep := e2eFreePort(t), e2eFreePort(t)
	return startSimProc(t, bin, simProcOpts{events: ev, replay: rep, health: true},
		"--served-model-name", "m", "--profile", "h100-llama3-8b", "--tokenizer", e2eQwen3Dir,
		"--max-model-len", "32768", "--num-gpu-blocks-override", "16384",
		"--kv-events-config", kvEventsConfig("*", ev, rep, ""))
}

// simProcOpts are startSimProc's settings: the event and replay ports the
// process publishes on (0: none; the e2eSim's events and replay name them
// on loopback), extra environment, and whether to wait for /health.
type simProcOpts struct {
	events, replay int
	env            []string
	health         bool
}

// kvEventsConfig is an engine-sim --kv-events-config binding host:events
// and host:replay, with extra JSON members (`"buffer_steps":N`) appended.
func kvEventsConfig(host string, events, replay int, extra string) string {
	kv := fmt.Sprintf(`{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://%s:%d","replay_endpoint":"tcp://%s:%d"`, host, events, host, replay)
	if extra != "" {
		kv += "," + extra
	}
	return kv + "}"
}

// startSimProc runs "kvrouter engine-sim --host 127.0.0.1 --port P args..."
// (P a free port, --log-level warn) as a process and stops it when the
// test ends, or at the returned e2eSim's stop: interrupt, kill after 10 s.
func startSimProc(t *testing.T, bin string, o simProcOpts, args ...string) *e2eSim {
	t.Helper()
	skipE2EShort(t)
	port := e2eFreePort(t)
	cmd := exec.Command(bin, append([]string{"engine-sim", "--host", "127.0.0.1", "--port", strconv.Itoa(port), "--log-level", "warn"}, args...)...)
	if o.env != nil {
		cmd.Env = append(os.Environ(), o.env...)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &e2eSim{url: fmt.Sprintf("http://127.0.0.1:%d", port)}
	if o.events != 0 {
		s.events, s.replay = fmt.Sprintf("tcp://127.0.0.1:%d", o.events), fmt.Sprintf("tcp://127.0.0.1:%d", o.replay)
	}
	var once sync.Once
	s.stop = func() {
		once.Do(func() {
			_ = cmd.Process.Signal(os.Interrupt)
			done := make(chan struct{})
			go func() { _ = cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				_ = cmd.Process.Kill()
				<-done
			}
		})
	}
	t.Cleanup(s.stop)
	if o.health {
		e2eEventually(t, 20*time.Second, "engine-sim process healthy", func() bool {
			resp, err := http.Get(s.url + "/health")
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == 200
		})
	}
	return s
}
