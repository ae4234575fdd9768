package proxy

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"kvrouter/internal/config"
	"kvrouter/internal/fleet"
	"kvrouter/internal/group"
)

// getReady returns GET /ready's status and decoded body.
func (rg *rig) getReady(query string) (int, readiness) {
	rg.t.Helper()
	resp, err := rg.client.Get(rg.front.URL + "/ready" + query)
	if err != nil {
		rg.t.Fatal(err)
	}
	body := readAll(rg.t, resp)
	var rd readiness
	if err := json.Unmarshal([]byte(body), &rd); err != nil {
		rg.t.Fatalf("ready body %q: %v", body, err)
	}
	if (resp.StatusCode == 200) != rd.Ready || resp.Header.Get("Content-Type") != "application/json" {
		rg.t.Fatalf("status %d, body %s", resp.StatusCode, body)
	}
	return resp.StatusCode, rd
}

func withEvents(c *config.Config, _ *fleet.Config) {
	for i := range c.Models[0].Engines {
		c.Models[0].Engines[i].Events = "tcp://127.0.0.1:5557"
	}
}

// TestReadyOneOfN: losing one of two engines (ejected, or its event stream
// down) keeps /ready at 200 and shows the degraded engine; losing both is
// a 503. ?full=1 wants every engine.
func TestReadyOneOfN(t *testing.T) {
	t.Run("approx index", func(t *testing.T) {
		rg := newRig(t, 2)
		if code, rd := rg.getReady(""); code != 200 || rd.Models[0].Index != "approx" || len(rd.Models[0].Engines) != 2 ||
			rd.Models[0].Engines[1] != (engineReady{Name: "e1", Up: true, Probed: true, Events: "none", Ready: true}) {
			t.Fatalf("%d %+v", code, rd)
		}
		rg.fleet.Report(rg.fleet.Endpoint("e1"), fleet.OutcomeConnError)
		code, rd := rg.getReady("")
		if code != 200 || rd.Models[0].Engines[1].Up || rd.Models[0].Engines[1].Ready || !rd.Models[0].Engines[0].Ready {
			t.Fatalf("one engine down: %d %+v", code, rd)
		}
		if code, rd := rg.getReady("?full=1"); code != 503 || rd.Mode != "all" {
			t.Fatalf("full with one engine down: %d %+v", code, rd)
		}
		rg.fleet.Report(rg.fleet.Endpoint("e0"), fleet.OutcomeConnError)
		if code, _ := rg.getReady(""); code != 503 {
			t.Fatalf("both down: %d", code)
		}
	})
	t.Run("exact index", func(t *testing.T) {
		rg := newRig(t, 2, withEvents)
		if code, rd := rg.getReady(""); code != 503 || rd.Models[0].Index != "exact" || rd.Models[0].Engines[0].Events != "disconnected" {
			t.Fatalf("no stream connected: %d %+v", code, rd)
		}
		// A wrong events endpoint on e1 (never connects): e0 suffices.
		rg.setConnected("e0")
		code, rd := rg.getReady("")
		if code != 200 || rd.Models[0].Engines[0].Events != "connected" || rd.Models[0].Engines[1].Events != "disconnected" || rd.Models[0].Engines[1].Ready {
			t.Fatalf("one stream connected: %d %+v", code, rd)
		}
		if code, _ := rg.getReady("?full=1"); code != 503 {
			t.Fatalf("full with one stream down: %d", code)
		}
		// e0 killed (ejected, its stream gone), e1 serving with its stream.
		rg.fleet.Report(rg.fleet.Endpoint("e0"), fleet.OutcomeConnError)
		rg.setConnected("e1")
		if code, rd := rg.getReady(""); code != 200 || rd.Models[0].Engines[0].Ready || !rd.Models[0].Engines[1].Ready {
			t.Fatalf("e0 dead, e1 connected: %d %+v", code, rd)
		}
		// The only up engine has no stream: the index sees nothing.
		rg.setConnected("e0")
		if code, _ := rg.getReady(""); code != 503 {
			t.Fatalf("up engine without stream, connected engine down: %d", code)
		}
		rg.setConnected("e0", "e1")
		if code, _ := rg.getReady("?full=1"); code != 503 {
			t.Fatalf("full with e0 ejected: %d", code)
		}
	})
	t.Run("not probed yet", func(t *testing.T) {
		rg := newRig(t, 1, func(_ *config.Config, f *fleet.Config) { f.ProbeInterval = time.Hour })
		if code, rd := rg.getReady(""); code != 503 || rd.Models[0].Engines[0].Probed {
			t.Fatalf("before any probe: %d %+v", code, rd)
		}
	})
}

// TestInFlightSeriesFromStart: every configured replica has its in-flight
// series at 0 before its first request.
func TestInFlightSeriesFromStart(t *testing.T) {
	rg := newRig(t, 3)
	resp, err := rg.client.Get(rg.front.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body := readAll(t, resp)
	for _, e := range []string{"e0", "e1", "e2"} {
		if want := `kvrouter_proxy_in_flight_requests{front="http",replica="` + e + `"} 0`; !containsLine(body, want) {
			t.Errorf("no %s in /metrics", want)
		}
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatal(resp.Status)
	}
}

// discovered turns the rig's group into a discovered one: router.yaml
// lists no engines (the fleet still has them, as the pool adds them).
func discovered(c *config.Config, _ *fleet.Config) {
	c.Models[0].Engines = nil
	c.Models[0].Discovery = &config.Discovery{Namespace: "ns", Service: "vllm"}
}

// TestReadyDiscovered: for a group whose engines come from discovery,
// /ready reports the index its router uses and each engine's event stream
// as its subscriber reports it, not what router.yaml (which lists no
// engines) would suggest.
func TestReadyDiscovered(t *testing.T) {
	t.Run("exact index, events", func(t *testing.T) {
		b, err := group.NewBackend(group.BackendConfig{Model: "m", Replicas: []string{"e0", "e1"}, Exact: true}, nil, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		rg := newRigRouter(t, 2, b, discovered)
		rg.mu.Lock()
		rg.connected = map[string]bool{"e0": true, "e1": false} // e1's subscriber not connected
		rg.mu.Unlock()
		code, rd := rg.getReady("")
		if code != 200 || rd.Models[0].Index != "exact" || len(rd.Models[0].Engines) != 2 ||
			rd.Models[0].Engines[0].Events != "connected" || !rd.Models[0].Engines[0].Ready ||
			rd.Models[0].Engines[1].Events != "disconnected" || rd.Models[0].Engines[1].Ready {
			t.Fatalf("%d %+v", code, rd)
		}
		rg.mu.Lock()
		rg.connected = map[string]bool{"e0": false, "e1": false}
		rg.mu.Unlock()
		if code, rd := rg.getReady(""); code != 503 || rd.Models[0].Engines[0].Events != "disconnected" {
			t.Fatalf("no stream connected: %d %+v", code, rd)
		}
	})
	t.Run("approx index, no events", func(t *testing.T) {
		b, err := group.NewBackend(group.BackendConfig{Model: "m", Replicas: []string{"e0"}}, nil, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		rg := newRigRouter(t, 1, b, discovered)
		if code, rd := rg.getReady(""); code != 200 || rd.Models[0].Index != "approx" || rd.Models[0].Engines[0].Events != "none" {
			t.Fatalf("%d %+v", code, rd)
		}
	})
}
