// Package promtest runs a real Prometheus (Debian's prometheus package,
// installed by tools/setup/setup.sh test) for tests: it scrapes loopback
// targets and answers instant queries over its HTTP API. Without the
// binary a test skips, or fails under KVROUTER_TOOLS_REQUIRED=1 (CI).
package promtest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// RequiredEnv set to 1 makes a missing tool a failure instead of a skip.
const RequiredEnv = "KVROUTER_TOOLS_REQUIRED"

// Tool returns the path of a command the tests need (prometheus, promtool,
// chromium), skipping the test, or failing it under RequiredEnv=1, when it
// is not installed. Under -short (make check) it skips the test even when
// the tool is installed, so the quick tier needs no system packages.
func Tool(t testing.TB, name string) string {
	t.Helper()
	if testing.Short() {
		t.Skipf("-short: needs %s (a system package)", name)
	}
	p, err := exec.LookPath(name)
	if err == nil {
		return p
	}
	msg := fmt.Sprintf("%s is not installed (tools/setup/setup.sh test installs it)", name)
	if os.Getenv(RequiredEnv) == "1" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// Job is one scrape job: its name and host:port targets (loopback).
type Job struct {
	Name    string
	Targets []string
	// Labels are added to every target's series.
	Labels map[string]string
}

// Server is a running Prometheus.
type Server struct {
	// URL is its base URL, http://127.0.0.1:port.
	URL string
}

// Start runs Prometheus scraping jobs every interval (at least 1s is
// sensible) with rule files loaded, in a temporary directory, and stops it
// when the test ends. It returns once the HTTP API answers.
func Start(t testing.TB, interval time.Duration, jobs []Job, ruleFiles ...string) *Server {
	t.Helper()
	bin := Tool(t, "prometheus")
	dir := t.TempDir()
	var cfg strings.Builder
	fmt.Fprintf(&cfg, "global:\n  scrape_interval: %s\n  evaluation_interval: %s\n", interval, interval)
	if len(ruleFiles) > 0 {
		cfg.WriteString("rule_files:\n")
		for _, f := range ruleFiles {
			abs, err := filepath.Abs(f)
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(&cfg, "  - %q\n", abs)
		}
	}
	cfg.WriteString("scrape_configs:\n")
	for _, j := range jobs {
		fmt.Fprintf(&cfg, "  - job_name: %q\n    static_configs:\n      - targets: [", j.Name)
		for i, tg := range j.Targets {
			if i > 0 {
				cfg.WriteString(", ")
			}
			fmt.Fprintf(&cfg, "%q", tg)
		}
		cfg.WriteString("]\n")
		if len(j.Labels) > 0 {
			cfg.WriteString("        labels:\n")
			for k, v := range j.Labels {
				fmt.Fprintf(&cfg, "          %s: %q\n", k, v)
			}
		}
	}
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, []byte(cfg.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	addr := "127.0.0.1:" + strconv.Itoa(port)
	cmd := exec.Command(bin, "--config.file="+cfgPath, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	var logs bytes.Buffer
	var mu sync.Mutex
	cmd.Stdout, cmd.Stderr = lockedWriter{&mu, &logs}, lockedWriter{&mu, &logs}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			mu.Lock()
			t.Logf("prometheus log:\n%s\nconfig:\n%s", logs.String(), cfg.String())
			mu.Unlock()
		}
	})
	s := &Server{URL: "http://" + addr}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(s.URL + "/-/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return s
			}
		}
		select {
		case <-done:
			mu.Lock()
			defer mu.Unlock()
			t.Fatalf("prometheus exited:\n%s", logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("prometheus not ready within 30 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// Sample is one element of an instant vector.
type Sample struct {
	Metric map[string]string
	Value  float64
}

// Query evaluates expr now and returns the vector (a scalar comes back as
// one sample without labels), or the API's error.
func (s *Server) Query(ctx context.Context, expr string) ([]Sample, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.URL+"/api/v1/query?query="+url.QueryEscape(expr), nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var body struct {
		Status, Error string
		Data          struct {
			ResultType string          `json:"resultType"`
			Result     json.RawMessage `json:"result"`
		}
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return nil, fmt.Errorf("query %q: %w", expr, err)
	}
	if body.Status != "success" {
		return nil, fmt.Errorf("query %q: %s", expr, body.Error)
	}
	parse := func(v [2]any) float64 {
		str, _ := v[1].(string)
		f, _ := strconv.ParseFloat(str, 64)
		return f
	}
	switch body.Data.ResultType {
	case "vector":
		var vec []struct {
			Metric map[string]string
			Value  [2]any
		}
		if err := json.Unmarshal(body.Data.Result, &vec); err != nil {
			return nil, err
		}
		out := make([]Sample, len(vec))
		for i, v := range vec {
			out[i] = Sample{v.Metric, parse(v.Value)}
		}
		return out, nil
	case "scalar":
		var v [2]any
		if err := json.Unmarshal(body.Data.Result, &v); err != nil {
			return nil, err
		}
		return []Sample{{nil, parse(v)}}, nil
	}
	return nil, fmt.Errorf("query %q: result type %s", expr, body.Data.ResultType)
}

// WaitTargetsUp waits until every scrape target has been scraped
// successfully at least once (up == 1 for all n targets).
func (s *Server) WaitTargetsUp(t testing.TB, n int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		v, err := s.Query(context.Background(), "sum(up)")
		if err == nil && len(v) == 1 && int(v[0].Value) == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d scrape targets up within %v, got %v (%v)", n, within, v, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}
