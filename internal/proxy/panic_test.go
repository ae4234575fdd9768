package proxy

import (
	"net"
	"sync"
	"testing"
	"time"

	"kvrouter/internal/config"
	"kvrouter/internal/fleet"
)

// stallListener accepts TCP connections on loopback and never answers on
// them: a TLS handshake to it times out, as to a starved engine.
func stallListener(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	})
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return ln.Addr().String()
}

// TestTimeoutIsReportedAsTimeout: a request whose engine connection times
// out (TLS handshake within timeouts.connect) is reported to the fleet as
// a timeout, not a connection error, so the model's only engine stays
// routable in panic mode: the next request is tried on it (502 from the
// failed attempt) instead of being refused with 503 no healthy replica.
func TestTimeoutIsReportedAsTimeout(t *testing.T) {
	addr := stallListener(t)
	rg := newRig(t, 1, func(c *config.Config, f *fleet.Config) {
		c.Models[0].Engines[0].URL = "https://" + addr
		f.Endpoints[0].URL = "https://" + addr
		c.Models[0].Retries = -1
		c.Models[0].Timeouts.Connect = 100 * time.Millisecond
	})
	for i := range 2 {
		resp := rg.post("/v1/completions", `{"model":"m","prompt":"hi"}`)
		body := readAll(t, resp)
		if resp.StatusCode != 502 {
			t.Fatalf("request %d: %d %s, want 502 (tried on the engine, which timed out)", i, resp.StatusCode, body)
		}
	}
	ep := rg.fleet.Endpoint("e0")
	if ep.Up() || !rg.fleet.Panic("m") {
		t.Fatalf("after timeouts: up %v, panic %v; want ejected for timeouts, panic mode", ep.Up(), rg.fleet.Panic("m"))
	}
	if eps, _, err := rg.fleet.Healthy(nil, "m"); err != nil || len(eps) != 1 {
		t.Fatalf("healthy %v, %v: want e0 routed in panic mode", eps, err)
	}
}
