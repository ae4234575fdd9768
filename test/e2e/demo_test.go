package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
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
