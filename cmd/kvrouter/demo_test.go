package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDemoSmall runs the demo on a few requests: engine-sims and kvrouter
// on loopback (HTTP and ZeroMQ), the comparison table, the HTML file at a
// relative path, reported by its absolute path.
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
	if b, err := os.ReadFile(html); err != nil || !strings.Contains(string(b), "<svg") {
		t.Fatalf("html: %v", err)
	}
	if !strings.Contains(errs, "HTML report written to "+html+"\n") {
		t.Fatalf("stderr does not name the report's absolute path %s:\n%s", html, errs)
	}
}
