package e2e

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"kvrouter/internal/config"
	"kvrouter/internal/serve"
)

// configMapDir writes router.yaml the way a Kubernetes ConfigMap volume
// holds it: dir/router.yaml -> ..data/router.yaml, ..data -> a timestamped
// directory; each write makes a new directory and swaps the ..data symlink
// atomically (rename over it), as the kubelet's AtomicWriter does.
type configMapDir struct {
	t   *testing.T
	dir string
	n   int
}

func newConfigMapDir(t *testing.T, yaml string) *configMapDir {
	c := &configMapDir{t: t, dir: t.TempDir()}
	c.write(yaml)
	if err := os.Symlink(filepath.Join("..data", "router.yaml"), c.path()); err != nil {
		t.Fatal(err)
	}
	return c
}

func (c *configMapDir) path() string { return filepath.Join(c.dir, "router.yaml") }

func (c *configMapDir) write(yaml string) {
	c.t.Helper()
	c.n++
	ts := fmt.Sprintf("..2026_12_01_%06d", c.n)
	if err := os.Mkdir(filepath.Join(c.dir, ts), 0o755); err != nil {
		c.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(c.dir, ts, "router.yaml"), []byte(yaml), 0o644); err != nil {
		c.t.Fatal(err)
	}
	tmp := filepath.Join(c.dir, "..data_tmp")
	if err := os.Symlink(ts, tmp); err != nil {
		c.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(c.dir, "..data")); err != nil {
		c.t.Fatal(err)
	}
}

// startReloadable runs serve in-process on --config path (polled every
// poll) with hup as its SIGHUP channel, logging into the returned sink.
func startReloadable(t *testing.T, path string, poll time.Duration, hup chan os.Signal) (string, *syncLog) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	env := func(string) string { return "" }
	cfg, pos, err := config.Parse(data, env)
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncLog{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("router log:\n%s", logs)
		}
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	o := serve.Options{Config: cfg, Positions: pos, ConfigPath: path, ConfigHash: sha256.Sum256(data), Getenv: env, Poll: poll, Reload: hup,
		Log: slog.New(slog.NewTextHandler(logs, nil))}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- runServe(ctx, o, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return "http://" + ln.Addr().String(), logs
}

func reloadYAML(policy string, engines ...[2]string) string {
	var b strings.Builder
	b.WriteString("health: {probe_interval: 50ms, scrape_interval: -1s, models_interval: -1s}\nmodels:\n  - name: m\n    tokenizer: none\n")
	fmt.Fprintf(&b, "    policy: %s\n    engines:\n", policy)
	for _, e := range engines {
		fmt.Fprintf(&b, "      - {name: %s, url: %q}\n", e[0], e[1])
	}
	return b.String()
}

// TestServeReload: router.yaml in a ConfigMap-style directory, polled.
// An added engine gets traffic; a bad file is refused once (logged,
// counted) and changes nothing; a removed engine loses its series, while
// a changed policy is reported as needing a restart and not applied;
// SIGHUP reloads an unchanged file.
func TestServeReload(t *testing.T) {
	e2eLeakCheck(t)
	a, b := startE2ESim(t), startE2ESim(t)
	cm := newConfigMapDir(t, reloadYAML("round_robin", [2]string{"a", a.url}))
	hup := make(chan os.Signal, 1)
	url, logs := startReloadable(t, cm.path(), 20*time.Millisecond, hup)
	r := &e2eRouter{t: t, url: url, client: &http.Client{Timeout: 10 * time.Second}}
	defer r.client.CloseIdleConnections()
	e2eEventually(t, 10*time.Second, "ready", func() bool { code, _ := r.ready(""); return code == 200 })
	served := func(n int) map[string]int {
		seen := map[string]int{}
		for i := range n {
			resp, body := r.post("/v1/completions", fmt.Sprintf(`{"model":"m","prompt":[1,2,%d],"max_tokens":2}`, i))
			if resp.StatusCode != 200 {
				t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
			}
			seen[resp.Header.Get("X-Kvrouter-Replica")]++
		}
		return seen
	}
	if s := served(4); s["a"] != 4 {
		t.Fatalf("before reload: %v", s)
	}
	reloads := func(result string) float64 {
		return e2eMetric(t, url, "kvrouter_config_reloads_total", `result="`+result+`"`)
	}

	// Add b.
	cm.write(reloadYAML("round_robin", [2]string{"a", a.url}, [2]string{"b", b.url}))
	e2eEventually(t, 10*time.Second, "b routed after the reload", func() bool { return served(2)["b"] > 0 })
	if got := reloads("ok"); got != 1 {
		t.Errorf("reloads ok = %v, want 1", got)
	}
	if !strings.Contains(logs.String(), `msg="config reloaded"`) || !strings.Contains(logs.String(), "engines_added=1 engines_removed=0") {
		t.Errorf("no reload line naming one engine added:\n%s", logs)
	}

	// A bad file: refused once, nothing changes.
	before := e2eMetric(t, url, "kvrouter_config_last_reload_success_timestamp_seconds")
	cm.write(reloadYAML("round_robin", [2]string{"a", a.url}) + "    bogus: 1\n")
	e2eEventually(t, 10*time.Second, "bad file refused", func() bool { return reloads("error") == 1 })
	time.Sleep(100 * time.Millisecond) // several polls of the same bad content
	if got := reloads("error"); got != 1 {
		t.Errorf("reloads error = %v after several polls of one bad file, want 1", got)
	}
	if n := strings.Count(logs.String(), "config reload refused"); n != 1 || !strings.Contains(logs.String(), `unknown field \"bogus\"`) {
		t.Errorf("%d refusal lines, want 1 naming the field:\n%s", n, logs)
	}
	if s := served(4); s["a"] == 0 || s["b"] == 0 {
		t.Errorf("after the bad file, want both engines still routed: %v", s)
	}
	if after := e2eMetric(t, url, "kvrouter_config_last_reload_success_timestamp_seconds"); after != before {
		t.Errorf("last success timestamp moved on a refused file: %v -> %v", before, after)
	}

	// Remove a, and change the policy (needs a restart: not applied).
	cm.write(reloadYAML("least_load", [2]string{"b", b.url}))
	e2eEventually(t, 10*time.Second, "a removed", func() bool {
		return e2eMetric(t, url, "kvrouter_pool_engines", `model="m"`) == 1
	})
	if s := served(4); s["b"] != 4 {
		t.Errorf("after removing a: %v", s)
	}
	l := logs.String()
	if !strings.Contains(l, `level=WARN msg="config reloaded"`) || !strings.Contains(l, `needs_restart=models[0].policy`) {
		t.Errorf("no reload line with needs_restart=models[0].policy:\n%s", l)
	}
	if v := e2eMetric(t, url, "kvrouter_config_restart_needed"); v != 1 {
		t.Errorf("kvrouter_config_restart_needed = %v, want 1", v)
	}
	if v := e2eMetric(t, url, "kvrouter_routing_decisions_total", `policy="round_robin"`); v == 0 {
		t.Errorf("the running policy changed to the file's: no round_robin decisions")
	}
	for _, name := range []string{"kvrouter_proxy_requests_total", "kvrouter_proxy_in_flight_requests"} {
		if n := e2eMetric(t, url, name, `replica="a"`); n != 0 {
			t.Errorf("%s of removed a: %v", name, n)
		}
	}
	metrics := e2eMetricsText(t, url)
	if strings.Contains(metrics, `"a"`) {
		t.Errorf("series labelled with removed engine a remain:\n%s", grepLines(metrics, `"a"`))
	}

	// SIGHUP with the content unchanged: reloaded (ok), nothing changes.
	ok := reloads("ok")
	hup <- syscall.SIGHUP
	e2eEventually(t, 10*time.Second, "SIGHUP reload", func() bool { return reloads("ok") == ok+1 })
	if !strings.Contains(logs.String(), "trigger=sighup engines_added=0 engines_removed=0 engines_changed=0") {
		t.Errorf("no SIGHUP reload line:\n%s", logs)
	}
}

// e2eMetricsText returns url's /metrics.
func e2eMetricsText(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func grepLines(s, sub string) string {
	var out []string
	for l := range strings.Lines(s) {
		if strings.Contains(l, sub) {
			out = append(out, strings.TrimSpace(l))
		}
	}
	return strings.Join(out, "\n")
}

// An engine moved from one model group to another in one reload: the
// removal from its old group runs first, so the new group can add it
// (engine names are unique in the fleet) even though the new group comes
// first in the file.
func TestServeReloadMoveEngine(t *testing.T) {
	e2eLeakCheck(t)
	a, b, c := startE2ESim(t), startE2ESim(t), startE2ESim(t)
	yaml := func(m, n string) string {
		return "health: {probe_interval: 50ms, scrape_interval: -1s, models_interval: -1s}\nmodels:\n" +
			"  - name: m\n    tokenizer: none\n    engines: [" + m + "]\n" +
			"  - name: n\n    tokenizer: none\n    engines: [" + n + "]\n"
	}
	ea, eb, ec := fmt.Sprintf("{name: a, url: %q}", a.url), fmt.Sprintf("{name: b, url: %q}", b.url), fmt.Sprintf("{name: c, url: %q}", c.url)
	cm := newConfigMapDir(t, yaml(ec, ea+", "+eb))
	hup := make(chan os.Signal, 1)
	url, logs := startReloadable(t, cm.path(), 0, hup)
	e2eEventually(t, 10*time.Second, "router up", func() bool { return e2eMetric(t, url, "kvrouter_pool_engines", `model="n"`) == 2 })
	cm.write(yaml(ea+", "+ec, eb))
	hup <- syscall.SIGHUP
	e2eEventually(t, 10*time.Second, "reloaded", func() bool {
		return e2eMetric(t, url, "kvrouter_config_reloads_total", `result="ok"`)+e2eMetric(t, url, "kvrouter_config_reloads_total", `result="error"`) == 1
	})
	if v := e2eMetric(t, url, "kvrouter_config_reloads_total", `result="ok"`); v != 1 {
		t.Fatalf("moving a from n to m: reload not ok:\n%s", logs)
	}
	if m, n := e2eMetric(t, url, "kvrouter_pool_engines", `model="m"`), e2eMetric(t, url, "kvrouter_pool_engines", `model="n"`); m != 2 || n != 1 {
		t.Errorf("engines m %v, n %v; want 2 and 1", m, n)
	}
	r := &e2eRouter{t: t, url: url, client: &http.Client{Timeout: 10 * time.Second}}
	defer r.client.CloseIdleConnections()
	e2eEventually(t, 10*time.Second, "a serves m", func() bool {
		resp, _ := r.post("/v1/completions", `{"model":"m","prompt":[1,2,3],"max_tokens":1}`, "X-Kvrouter-Route-Only", "0")
		return resp.StatusCode == 200 && resp.Header.Get("X-Kvrouter-Replica") == "a"
	})
}
