package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// stallFront fronts an engine-sim with a reverse proxy whose GET /health
// can be made to stall (a CPU- or memory-starved host: the engine still
// serves, slowly, but its probe times out).
type stallFront struct {
	url   string
	stall atomic.Bool
}

func newStallFront(t *testing.T, target string) *stallFront {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.FlushInterval = -1
	f := &stallFront{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" && f.stall.Load() {
			<-r.Context().Done()
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	f.url = srv.URL
	return f
}

// TestE2EPanicModeStalledHealth reproduces the field trial's starvation:
// every engine's /health stops answering within probe_timeout while the
// engines still serve. Before panic mode the router ejected them all and
// answered "503 no healthy endpoint"; now the model enters panic mode
// (kvrouter_fleet_panic_mode 1, one warning) and requests are served by the
// engines, and panic mode ends when the probes answer again.
func TestE2EPanicModeStalledHealth(t *testing.T) {
	e2eLeakCheck(t)
	a, b := newStallFront(t, startE2ESim(t).url), newStallFront(t, startE2ESim(t).url)
	url, logs := serveLogged(t, fmt.Sprintf(`health: {probe_interval: 50ms, probe_timeout: 100ms, scrape_interval: -1s}
models:
  - name: m
    tokenizer: none
    engines: [{name: e0, url: %q}, {name: e1, url: %q}]
`, a.url, b.url))
	r := &e2eRouter{t: t, url: url, client: &http.Client{Timeout: 10 * time.Second}}
	defer r.client.CloseIdleConnections()
	e2eEventually(t, 20*time.Second, "ready", func() bool { code, _ := r.ready("?full=1"); return code == 200 })
	a.stall.Store(true)
	b.stall.Store(true)
	e2eEventually(t, 20*time.Second, "panic mode", func() bool {
		return e2eMetric(t, url, "kvrouter_fleet_panic_mode", `model="m"`) == 1
	})
	if up := e2eMetric(t, url, "kvrouter_fleet_endpoint_up"); up != 0 {
		t.Fatalf("%v engines up with every /health stalled, want 0", up)
	}
	seen := map[string]bool{}
	for i := range 10 {
		resp, body := r.post("/v1/completions", fmt.Sprintf(`{"model":"m","prompt":[1,2,3,%d],"max_tokens":2}`, i))
		if resp.StatusCode != 200 {
			t.Fatalf("request %d in panic mode: %d %s", i, resp.StatusCode, body)
		}
		seen[resp.Header.Get("X-Kvrouter-Replica")] = true
	}
	if code, st := r.ready(""); code != 200 {
		t.Errorf("/ready %d in panic mode (engines routed): %+v", code, st)
	}
	a.stall.Store(false)
	b.stall.Store(false)
	e2eEventually(t, 20*time.Second, "panic mode over", func() bool {
		return e2eMetric(t, url, "kvrouter_fleet_panic_mode", `model="m"`) == 0
	})
	l := logs.String()
	if n := strings.Count(l, "panic mode: too few endpoints up"); n != 1 {
		t.Errorf("%d panic lines, want 1:\n%s", n, l)
	}
	if !strings.Contains(l, `msg="panic mode over" model=m`) {
		t.Errorf("no 'panic mode over' line:\n%s", l)
	}
	t.Logf("replicas used in panic mode: %v", seen)
}

// TestE2EModelNameNotServed: the field trial's --model llama-3.1-8b before
// engines serving another name. /ready turns 503 with the engine marked
// model_missing, kvrouter_fleet_model_not_served is 1, and one error line
// names the configured and the served names.
func TestE2EModelNameNotServed(t *testing.T) {
	e2eLeakCheck(t)
	sim := startE2ESim(t) // serves "m"
	url, logs := serveLogged(t, fmt.Sprintf(`health: {probe_interval: 100ms, models_interval: 100ms}
models:
  - name: llama-3.1-8b
    tokenizer: none
    engines: [{name: e0, url: %q}]
`, sim.url))
	r := &e2eRouter{t: t, url: url, client: &http.Client{Timeout: 10 * time.Second}}
	defer r.client.CloseIdleConnections()
	var body []byte
	e2eEventually(t, 10*time.Second, "/ready 503 naming the missing model", func() bool {
		resp, err := r.client.Get(url + "/ready")
		if err != nil {
			return false
		}
		body, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		// The probe and the model check run concurrently: wait for both.
		return resp.StatusCode == 503 && strings.Contains(string(body), `"probed":true,"model_missing":true`)
	})
	var st struct {
		Models []struct {
			Engines []struct {
				Up, Probed bool
			} `json:"engines"`
		} `json:"models"`
	}
	if err := json.Unmarshal(body, &st); err != nil || !st.Models[0].Engines[0].Up || !st.Models[0].Engines[0].Probed {
		t.Errorf("/ready body %s: the engine itself is up and probed", body)
	}
	if v := e2eMetric(t, url, "kvrouter_fleet_model_not_served", `endpoint="e0"`, `model="llama-3.1-8b"`); v != 1 {
		t.Errorf("kvrouter_fleet_model_not_served = %v, want 1", v)
	}
	time.Sleep(300 * time.Millisecond) // a few more checks: still one line
	l := logs.String()
	if n := strings.Count(l, "engine does not serve the configured model name"); n != 1 || !strings.Contains(l, "model=llama-3.1-8b served=[m]") {
		t.Errorf("%d lines, want 1 naming llama-3.1-8b and m:\n%s", n, l)
	}
}
