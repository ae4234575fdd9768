package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kvrouter/internal/bench/report"
)

// TestDemoSmall runs the demo on a few requests: engine-sims and kvrouter
// on loopback (HTTP and ZeroMQ), the comparison table, the HTML file at a
// relative path, reported by its absolute path, and the slice's
// pooled-cache bound beside the table.
func TestDemoSmall(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	html := filepath.Join(dir, "demo.html")
	code, out, errs := runCmd(t, "demo", "--requests", "30", "--engines", "2", "--policies", "round_robin,kv", "--num-gpu-blocks", "2000", "--max-output-tokens", "16", "--html", "demo.html")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if !strings.Contains(out, "| round_robin") || !strings.Contains(out, "| kv") {
		t.Fatalf("table:\n%s\nstderr:\n%s", out, errs)
	}
	// The replayed slice's pooled-cache bound: 2 engines x (2,000 - 1)
	// usable blocks, and each policy's share of it.
	if !strings.Contains(out, "Pooled-cache bound (the fleet's 3998 GPU blocks as one LRU") ||
		!strings.Contains(out, "share of its cached tokens: round_robin ") || !strings.Contains(out, ", kv ") ||
		!strings.Contains(out, "Hit-rate bound") {
		t.Fatalf("no pooled-cache bound for the slice:\n%s", out)
	}
	if b, err := os.ReadFile(html); err != nil || !strings.Contains(string(b), "<svg") {
		t.Fatalf("html: %v", err)
	}
	if !strings.Contains(errs, "HTML report written to "+html+"\n") {
		t.Fatalf("stderr does not name the report's absolute path %s:\n%s", html, errs)
	}
}

// TestDemoWarnsWhenBehind checks that the demo names each run whose replay
// sent more than one request in twenty late, or whose engines' steps took
// more than a quarter longer than modelled, and says nothing when every run
// kept pace.
func TestDemoWarnsWhenBehind(t *testing.T) {
	run := func(name string, n, late int, lag time.Duration) demoPace {
		return demoPace{run: &report.Run{Policy: name, Samples: make([]report.Sample, n), LateSends: late, MaxLateness: 1234 * time.Millisecond},
			lag: lag, modelled: 10 * time.Second}
	}
	var b strings.Builder
	warnBehind(&b, []demoPace{run("round_robin", 100, 5, 2500*time.Millisecond), run("kv", 100, 0, 0)}, 10)
	if b.Len() != 0 {
		t.Fatalf("runs that kept pace (5 of 100 late, engines 25%% slow at most) drew a warning: %q", b.String())
	}
	warnBehind(&b, []demoPace{run("round_robin", 100, 6, 0), run("kv", 100, 40, 0), run("least_load", 100, 0, 3*time.Second)}, 10)
	for _, want := range []string{
		"round_robin: this machine could not keep pace with the trace: 6 of 100 requests were sent more than 50ms late (up to 1.234s)",
		"kv: this machine could not keep pace with the trace: 40 of 100",
		"least_load: this machine could not keep pace with the trace: the engines' steps took 30% longer than their timing model (3s beyond 10s)",
		"the replay fell behind", "--speed 5",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("warning lacks %q:\n%s", want, b.String())
		}
	}
}
