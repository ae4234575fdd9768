package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// stallSend is one streamed request of TestE2EFrozenEngineHeldOut.
type stallSend struct {
	sent    time.Time
	replica string
}

// TestE2EFrozenEngineHeldOut: engine e0's core hangs (engine-sim POST
// /admin/freeze) while its HTTP server keeps answering /health (200) and
// /metrics (frozen counters), and streams get their headers but no byte,
// as a vLLM engine with a stuck GPU step does. Requests keep coming every
// 50 ms by round robin. The router must stop sending e0 new requests
// about 1-2 s after the first request sent there became overdue (waited
// health.stall_after, 1 s), count a stall ejection, and route e0 again
// once it thaws. Before stall detection looked at progress, answered
// probes and scrapes kept e0 in forever.
func TestE2EFrozenEngineHeldOut(t *testing.T) {
	e2eLeakCheck(t)
	a, b := startE2ESim(t), startE2ESim(t)
	url, _ := serveLogged(t, fmt.Sprintf(`health: {probe_interval: 200ms, scrape_interval: 1s}
models:
  - name: m
    tokenizer: none
    policy: round_robin
    engines: [{name: e0, url: %q}, {name: e1, url: %q}]
`, a.url, b.url))
	r := &e2eRouter{t: t, url: url, client: &http.Client{Transport: &http.Transport{}}}
	defer r.client.CloseIdleConnections()
	e2eEventually(t, 20*time.Second, "ready", func() bool { code, _ := r.ready("?full=1"); return code == 200 })

	for i := range 4 { // both engines serve
		if resp, body := r.post("/v1/completions", fmt.Sprintf(`{"model":"m","prompt":[1,2,%d],"max_tokens":2}`, i)); resp.StatusCode != 200 {
			t.Fatalf("warm-up %d: %d %s", i, resp.StatusCode, body)
		}
	}

	ctx, cancel := context.WithCancel(context.Background())
	var (
		wg          sync.WaitGroup
		mu          sync.Mutex
		sends       []stallSend
		held        []io.ReadCloser // e0's streams, waiting for their first byte
		stopOnce    sync.Once
		stopSending = make(chan struct{})
		sender      = make(chan struct{})
	)
	stop := func() {
		stopOnce.Do(func() { close(stopSending) })
		<-sender
	}
	defer func() {
		stop()
		cancel()
		wg.Wait()
	}()
	// send streams one request; it returns when the headers arrive (the
	// router relays them at once), reading a live engine's stream to its
	// end and holding a frozen one's.
	send := func(i int) {
		defer wg.Done()
		body := fmt.Sprintf(`{"model":"m","prompt":[1,2,3,%d],"max_tokens":2,"stream":true}`, i)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		sent := time.Now()
		resp, err := r.client.Do(req)
		if err != nil {
			return // the test ended
		}
		rep := resp.Header.Get("X-Kvrouter-Replica")
		mu.Lock()
		sends = append(sends, stallSend{sent, rep})
		if rep == "e0" {
			held = append(held, resp.Body)
			mu.Unlock()
			return
		}
		mu.Unlock()
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	post := func(u string) {
		t.Helper()
		resp, err := http.Post(u, "application/json", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("POST %s: %d", u, resp.StatusCode)
		}
	}
	probesBefore := e2eMetric(t, url, "kvrouter_fleet_probes_total", `endpoint="e0"`, `result="ok"`)
	frozeAt := time.Now()
	post(a.url + "/admin/freeze?duration=5m")
	go func() { // a request every 50 ms until told to stop
		defer close(sender)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for i := 4; ; i++ {
			select {
			case <-stopSending:
				return
			case <-tick.C:
			}
			wg.Add(1)
			go send(i)
		}
	}()
	e2eEventually(t, 15*time.Second, "a stall ejection of e0", func() bool {
		return e2eMetric(t, url, "kvrouter_fleet_ejections_total", `endpoint="e0"`, `reason="stall"`) == 1
	})
	heldOutAt := time.Now()
	e2eEventually(t, 10*time.Second, "20 requests sent after e0 was held out", func() bool {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, s := range sends {
			if s.sent.After(heldOutAt) {
				n++
			}
		}
		return n >= 20
	})
	stop()

	mu.Lock()
	var firstE0, lastE0 time.Time
	after := 0
	for _, s := range sends {
		if !s.sent.After(frozeAt) {
			continue
		}
		if s.replica == "e0" {
			if firstE0.IsZero() || s.sent.Before(firstE0) {
				firstE0 = s.sent
			}
			if s.sent.After(lastE0) {
				lastE0 = s.sent
			}
		}
		if s.sent.After(heldOutAt) {
			after++
			if s.replica != "e1" {
				t.Errorf("a request sent %v after the stall ejection went to %q, want e1", s.sent.Sub(heldOutAt), s.replica)
			}
		}
	}
	mu.Unlock()
	if firstE0.IsZero() {
		t.Fatal("no request went to e0 after the freeze")
	}
	overdue := firstE0.Add(time.Second) // stall_after, the floor of a tiny prompt's deadline
	lag := lastE0.Sub(overdue)
	t.Logf("froze e0; first request there after %v, overdue at %v, last one routed there %v after that; %d requests after the ejection all to e1",
		firstE0.Sub(frozeAt).Round(time.Millisecond), overdue.Sub(frozeAt).Round(time.Millisecond), lag.Round(time.Millisecond), after)
	if lag > 2500*time.Millisecond {
		t.Errorf("e0 took new requests %v after the first overdue one, want about 1-2 s", lag)
	}
	if probes := e2eMetric(t, url, "kvrouter_fleet_probes_total", `endpoint="e0"`, `result="ok"`); probes <= probesBefore {
		t.Errorf("e0's /health probes ok %v, before the freeze %v: the frozen engine should keep answering them", probes, probesBefore)
	}
	if up := e2eMetric(t, url, "kvrouter_fleet_endpoint_up", `endpoint="e0"`); up != 0 {
		t.Errorf("kvrouter_fleet_endpoint_up{e0} = %v while stalled, want 0", up)
	}

	post(a.url + "/admin/freeze?duration=0s") // thaw: e0's held streams get their bytes
	mu.Lock()
	waiting := held
	mu.Unlock()
	for _, body := range waiting {
		if _, err := io.Copy(io.Discard, body); err != nil {
			t.Errorf("a stream held on e0 after the thaw: %v", err)
		}
		body.Close()
	}
	e2eEventually(t, 10*time.Second, "e0 routed again after the thaw", func() bool {
		resp, _ := r.post("/v1/completions", `{"model":"m","prompt":[9,9,9],"max_tokens":2}`)
		return resp.Header.Get("X-Kvrouter-Replica") == "e0"
	})
	if up := e2eMetric(t, url, "kvrouter_fleet_endpoint_up", `endpoint="e0"`); up != 1 {
		t.Errorf("kvrouter_fleet_endpoint_up{e0} = %v after the thaw, want 1", up)
	}
}
