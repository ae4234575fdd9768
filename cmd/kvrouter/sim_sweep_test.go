package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSimLoadSweep: --load with a list simulates each load and reports
// goodput per policy at each (JSON "sweep", a markdown table, an HTML plot);
// goodput of round_robin does not rise when the load is four times higher
// on a saturated fleet.
func TestSimLoadSweep(t *testing.T) {
	html := filepath.Join(t.TempDir(), "r.html")
	code, out, stderr := runCmd(t, "sim", "--scenario", "mooncake", "--requests", "200", "--replicas", "2",
		"--load", "0.5,2", "--policies", "round_robin,kv", "--json", "--html", html)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var r struct {
		Sweep []struct {
			Load       float64 `json:"load"`
			Policy     string  `json:"policy"`
			GoodputRPS float64 `json:"goodput_rps"`
		} `json:"sweep"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	if len(r.Sweep) != 4 || r.Sweep[0].Load != 0.5 || r.Sweep[3].Load != 2 || r.Sweep[0].Policy != "round_robin" || r.Sweep[1].Policy != "kv" {
		t.Fatalf("sweep %+v", r.Sweep)
	}
	if r.Sweep[2].GoodputRPS > r.Sweep[0].GoodputRPS {
		t.Errorf("round_robin goodput rose from %.2f to %.2f at 4x the load", r.Sweep[0].GoodputRPS, r.Sweep[2].GoodputRPS)
	}
	page, err := os.ReadFile(html)
	if err != nil || !strings.Contains(string(page), `aria-label="Goodput against offered load"`) {
		t.Errorf("html lacks the sweep plot (%v)", err)
	}
	_, md, _ := runCmd(t, "sim", "--scenario", "mooncake", "--requests", "100", "--replicas", "2", "--load", "0.5,1", "--policies", "kv")
	if !strings.Contains(md, "Goodput (req/s) against offered load:") || !strings.Contains(md, "| 0.5 |") {
		t.Errorf("markdown:\n%s", md)
	}
	for _, bad := range []string{"0,1", "x", "-1", "1,inf"} {
		if code, _, _ := runCmd(t, "sim", "--load", bad); code != 2 {
			t.Errorf("--load %s: exit %d, want 2", bad, code)
		}
	}
}
