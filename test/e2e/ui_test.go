package e2e

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kvrouter/internal/browsertest"
	"kvrouter/internal/promtest"
)

// uiArtifact is where TestUIChromium keeps its screenshot:
// $KVROUTER_ARTIFACTS/ui.png, else kvrouter-artifacts/ui.png in the system's
// temporary directory (not under the repository).
func uiArtifact() string {
	dir := os.Getenv("KVROUTER_ARTIFACTS")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "kvrouter-artifacts")
	}
	return filepath.Join(dir, "ui.png")
}

// TestUIChromium loads /ui of a live fleet (two engine-sim processes with
// KV events, kvrouter with kv) in headless Chromium: the page shows each
// engine up with its event stream connected and the recent decisions with
// their explain; when an engine is stopped, the same page (no reload)
// turns it ejected. A screenshot is kept (uiArtifact).
func TestUIChromium(t *testing.T) {
	promtest.Tool(t, "chromium")
	e2eLeakCheck(t)
	bin := e2eBuild(t)
	a, b := opsSim(t, bin, "m"), opsSim(t, bin, "m")
	url, _ := serveLogged(t, fmt.Sprintf(`health: {probe_interval: 200ms, scrape_interval: 200ms, probe_timeout: 500ms}
models:
  - name: m
    tokenizer: %s
    engines:
      - {name: gpu-a, url: %q, events: %q, replay: %q}
      - {name: gpu-b, url: %q, events: %q, replay: %q}
`, e2eQwen3Dir, a.url, a.events, a.replay, b.url, b.events, b.replay))
	r := &e2eRouter{t: t, url: url, client: &http.Client{Timeout: 30 * time.Second}}
	t.Cleanup(r.client.CloseIdleConnections)
	opsWaitReady(t, url)
	t.Cleanup(func() { a.stop(); b.stop() })
	for i := range 6 {
		if err := opsPost(r, "/v1/chat/completions", e2eChat("You are a helpful assistant.", fmt.Sprintf("question %d", i%2))); err != nil {
			t.Fatal(err)
		}
	}

	page := browsertest.Open(t, url+"/ui")
	type row struct{ Engine, State, Events string }
	rows := func() map[string]row {
		var rs []row
		page.Eval(`[...document.querySelectorAll("tr[data-engine]")].map(r => ({Engine: r.dataset.engine, State: r.dataset.state, Events: r.dataset.events}))`, &rs)
		m := map[string]row{}
		for _, x := range rs {
			m[x.Engine] = x
		}
		return m
	}
	polls := func() int {
		var n string
		page.Eval(`document.body.dataset.polls || "0"`, &n)
		var v int
		fmt.Sscan(n, &v)
		return v
	}
	e2eEventually(t, 20*time.Second, "both engines up and connected on the page", func() bool {
		m := rows()
		return m["gpu-a"] == row{"gpu-a", "up", "connected"} && m["gpu-b"] == row{"gpu-b", "up", "connected"}
	})
	var decisions int
	page.Eval(`document.querySelectorAll("details[data-request]").length`, &decisions)
	var explain string
	page.Eval(`(document.querySelector("details[data-request] pre") || {}).textContent || ""`, &explain)
	if decisions != 6 || !strings.Contains(explain, `"policy": "kv"`) || !strings.Contains(explain, `"cached_tokens"`) {
		t.Errorf("recent decisions: %d, explain %q; want 6 with kv's explain", decisions, explain)
	}
	var hit string
	page.Eval(`document.querySelector("section[data-model=m] .summary").textContent`, &hit)
	if !strings.Contains(hit, "engines up 2 / 2") || !strings.Contains(hit, "hit rate predicted") {
		t.Errorf("summary %q", hit)
	}
	before := polls()
	b.stop()
	e2eEventually(t, 20*time.Second, "gpu-b ejected on the same page", func() bool {
		m := rows()
		return m["gpu-b"].State == "ejected" && m["gpu-a"].State == "up"
	})
	if after := polls(); after <= before {
		t.Errorf("polls %d -> %d: the page did not update itself", before, after)
	}
	png := page.Screenshot()
	if len(png) < 1000 || string(png[1:4]) != "PNG" {
		t.Fatalf("screenshot: %d bytes", len(png))
	}
	path := uiArtifact()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s (%d bytes)", path, len(png))
}
