package e2e

import (
	"bufio"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"kvrouter/internal/enginesim"
)

// documentedMetrics returns every kvrouter metric name the docs name: full
// names anywhere in docs/*.md and README.md, and the short names listed
// after `kvrouter_kvindex_*` and `kvrouter_routing_*` in docs/routing.md
// (with {a,b} alternatives expanded and {label} suffixes dropped). The
// engine simulator's own kvrouter_enginesim_* are not the router's; the
// kvrouter_discovery_* series exist per discovered model group (labelled
// source), so a router with a static engine list has none (the discovery
// package's tests read them); the kvrouter_epp_* series exist only under
// kvrouter epp (TestEPPDocumentedMetrics reads them).
func documentedMetrics(t *testing.T) []string {
	t.Helper()
	files, _ := filepath.Glob("../../docs/*.md")
	files = append(files, "../../README.md")
	full := regexp.MustCompile(`kvrouter_[a-z0-9_]*[a-z0-9]\b`)
	tick := regexp.MustCompile("`([^`]+)`")
	seen := map[string]bool{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range full.FindAllString(string(b), -1) {
			if !strings.HasPrefix(m, "kvrouter_enginesim_") && !strings.HasPrefix(m, "kvrouter_discovery_") && !strings.HasPrefix(m, "kvrouter_epp_") && m != "kvrouter_bin" {
				seen[m] = true
			}
		}
		labels := regexp.MustCompile(`\(labels [^)]*\)`)
		for _, para := range strings.Split(labels.ReplaceAllString(string(b), ""), "\n\n") {
			for _, prefix := range []string{"kvrouter_kvindex_", "kvrouter_routing_"} {
				if !strings.HasPrefix(para, "`"+prefix+"*`") {
					continue
				}
				for _, m := range tick.FindAllStringSubmatch(para, -1) {
					for _, name := range expandBraces(m[1]) {
						if strings.ContainsAny(name, "*(.= ") {
							continue
						}
						seen[prefix+name] = true
					}
				}
			}
		}
	}
	out := make([]string, 0, len(seen))
	for n := range seen {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// expandBraces expands one {a,b,c} group (blocks_{stored,removed}_total)
// and drops a trailing {label} group (decisions_total{replica}).
func expandBraces(s string) []string {
	i := strings.IndexByte(s, '{')
	j := strings.IndexByte(s, '}')
	if i < 0 || j < i {
		return []string{s}
	}
	if j == len(s)-1 && !strings.Contains(s[i:j], ",") {
		return []string{s[:i]}
	}
	var out []string
	for alt := range strings.SplitSeq(s[i+1:j], ",") {
		out = append(out, s[:i]+alt+s[j+1:])
	}
	return out
}

// TestDocumentedMetricsExistAtStart: a freshly started router (no request
// served, no event received) exports every metric the docs name, so that
// alerts on them see 0, not "no data". Two models cover the optional
// parts: m (local tokenizer with its mismatch probe, KV events configured,
// a route alias and an adapter),
// n (shadow mode, render tokenizer, approximate index).
func TestDocumentedMetricsExistAtStart(t *testing.T) {
	e2eLeakCheck(t)
	names := documentedMetrics(t)
	if len(names) < 60 {
		t.Fatalf("only %d documented metrics found: the docs' parsing broke: %v", len(names), names)
	}
	simM := startE2ESim(t)
	simN := startE2ESim(t, func(c *enginesim.Config) { c.ServedModelName = "n" })
	pdName := func(c *enginesim.Config) { c.ServedModelName = "pd" }
	simP, simD := startE2ESim(t, pdName), startE2ESim(t, pdName)
	yaml := fmt.Sprintf("health: {probe_interval: 200ms, scrape_interval: 200ms}\nmodels:\n"+
		"  - name: m\n    tokenizer: %s\n    tokenizer_mismatch: continue\n    aliases: [{name: m-fast}]\n    adapters: [{name: sql}]\n    engines:\n      - {name: e0, url: %q, events: 'tcp://127.0.0.1:%d'}\n"+
		"  - name: n\n    policy: shadow\n    engines:\n      - {name: e1, url: %q}\n"+
		"  - name: pd\n    tokenizer: none\n    engines:\n      - {name: e2, url: %q, role: prefill}\n      - {name: e3, url: %q, role: decode}\n",
		e2eQwen3Dir, simM.url, e2eFreePort(t), simN.url, simP.url, simD.url)
	r := serveYAML(t, yaml, slog.LevelWarn)
	e2eEventually(t, 10*time.Second, "router up", func() bool {
		resp, err := r.client.Get(r.url + "/health")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == 200
	})
	resp, err := http.Get(r.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	have := map[string]bool{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) >= 3 && f[0] == "#" && f[1] == "TYPE" {
			have[f[2]] = true
		}
	}
	var missing []string
	for _, n := range names {
		if !have[n] {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		t.Errorf("%d of %d documented metrics absent from a fresh router's /metrics:\n%s", len(missing), len(names), strings.Join(missing, "\n"))
	}
}
