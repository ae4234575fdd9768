package proxy

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"kvrouter/internal/config"
	"kvrouter/internal/fleet"
)

// runFront serves rg's Server with Run on a loopback TCP listener (the
// listener limits apply there, not under httptest) and returns its
// address; the test's end drains it.
func (rg *rig) runFront() string {
	rg.t.Helper()
	return rg.runListener(rg.srv.Run)
}

func (rg *rig) runListener(run func(context.Context, net.Listener) error) string {
	rg.t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		rg.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, ln) }()
	rg.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			rg.t.Errorf("Run: %v", err)
		}
	})
	return ln.Addr().String()
}

// dial opens a TCP connection to addr, closed at the test's end.
func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// roundTrip writes a raw HTTP/1.1 request on c and reads the answer.
func roundTrip(t *testing.T, c net.Conn, br *bufio.Reader, method, path string) (*http.Response, string) {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := fmt.Fprintf(c, "%s %s HTTP/1.1\r\nHost: kvrouter\r\n\r\n", method, path); err != nil {
		t.Fatalf("%s %s: write: %v", method, path, err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

// waitClosed waits until the server closes c (a read ends with EOF or a
// reset), failing after limit.
func waitClosed(t *testing.T, c net.Conn, limit time.Duration, what string) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(limit))
	buf := make([]byte, 512)
	for {
		_, err := c.Read(buf)
		if err == nil {
			continue
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("%s: connection still open after %v", what, limit)
		}
		return
	}
}

// pollGauge waits for read() to return want.
func pollGauge(t *testing.T, what string, want float64, read func() float64) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got := read()
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v, want %v", what, got, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// An idle client loses its connection after header_timeout (nothing sent)
// or idle_timeout (after an answer, keep-alive); real TCP on loopback.
func TestListenerClosesIdleConnections(t *testing.T) {
	rg := newRig(t, 1, func(c *config.Config, _ *fleet.Config) {
		c.HTTP.HeaderTimeout = 300 * time.Millisecond
		c.HTTP.IdleTimeout = 300 * time.Millisecond
	})
	addr := rg.runFront()
	silent := dial(t, addr)
	keep := dial(t, addr)
	br := bufio.NewReader(keep)
	if resp, _ := roundTrip(t, keep, br, "GET", "/health"); resp.StatusCode != 200 || resp.Close {
		t.Fatalf("GET /health: %d (close %v), want 200 on a kept-alive connection", resp.StatusCode, resp.Close)
	}
	// Generous bounds (a loaded machine): the defaults before this limit
	// kept both for 30 s.
	waitClosed(t, silent, 10*time.Second, "connection that sent nothing")
	waitClosed(t, keep, 10*time.Second, "idle keep-alive connection")
	pollGauge(t, "kvrouter_proxy_connections{listener=main}", 0, func() float64 {
		return testutil.ToFloat64(rg.srv.lm.conns.WithLabelValues(listenerMain))
	})
}

// Headers over http.max_header_bytes are refused (431) instead of held.
func TestListenerHeaderBytes(t *testing.T) {
	rg := newRig(t, 1, func(c *config.Config, _ *fleet.Config) { c.HTTP.MaxHeaderBytes = 8 << 10 })
	c := dial(t, rg.runFront())
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	fmt.Fprintf(c, "GET /health HTTP/1.1\r\nHost: kvrouter\r\nX-Big: %s\r\n\r\n", strings.Repeat("b", 100<<10))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("GET /health with 100 KiB of headers: %d, want 431", resp.StatusCode)
	}
}

// At max_connections, /health and /ready still answer on reserved
// connections (then close), other requests there get an OpenAI-shaped 503
// with Retry-After, and past the reserve a silent reserved connection
// makes room.
// Closing the holders brings the count back to 0.
func TestListenerConnectionCap(t *testing.T) {
	rg := newRig(t, 1, func(c *config.Config, _ *fleet.Config) {
		c.HTTP.HeaderTimeout = time.Minute
		c.HTTP.IdleTimeout = time.Minute
		c.HTTP.MaxConnections = 4
		c.HTTP.ReservedConnections = 2
	})
	addr := rg.runFront()
	open := func() float64 { return testutil.ToFloat64(rg.srv.lm.conns.WithLabelValues(listenerMain)) }
	var holders []net.Conn
	for range 4 {
		holders = append(holders, dial(t, addr))
	}
	pollGauge(t, "open connections", 4, open)

	for _, path := range []string{"/health", "/ready"} {
		c := dial(t, addr)
		resp, body := roundTrip(t, c, bufio.NewReader(c), "GET", path)
		if path == "/health" && resp.StatusCode != 200 || strings.Contains(body, "max_connections") {
			t.Fatalf("GET %s at the cap: %d %s", path, resp.StatusCode, body)
		}
		if !resp.Close {
			t.Errorf("GET %s on a reserved connection: not closed after the answer", path)
		}
		waitClosed(t, c, 10*time.Second, "reserved connection after its answer")
	}
	c := dial(t, addr)
	resp, body := roundTrip(t, c, bufio.NewReader(c), "GET", "/v1/models")
	var e errorBody
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" ||
		json.Unmarshal([]byte(body), &e) != nil || e.Error.Type != typeServiceUnavailable || !strings.Contains(e.Error.Message, "max_connections") {
		t.Fatalf("GET /v1/models at the cap: %d Retry-After=%q %s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	c.Close()

	// Fill the reserve too: the next connection displaces the oldest
	// silent one, which is closed (TestReserveDisplacesOldestSilent).
	pollGauge(t, "open connections", 4, open)
	for range 2 {
		holders = append(holders, dial(t, addr))
	}
	pollGauge(t, "open connections", 6, open)
	over := dial(t, addr)
	waitClosed(t, holders[4], 10*time.Second, "oldest silent reserved connection")
	over.Close()
	if n := testutil.ToFloat64(rg.srv.lm.rejected.WithLabelValues(listenerMain, "max_connections")); n < 1 {
		t.Errorf("connections_rejected_total{reason=max_connections} = %v, want >= 1", n)
	}
	for _, h := range holders {
		h.Close()
	}
	pollGauge(t, "open connections after the holders left", 0, open)
	// Served again.
	c = dial(t, addr)
	if resp, _ := roundTrip(t, c, bufio.NewReader(c), "GET", "/v1/models"); resp.StatusCode != 200 {
		t.Fatalf("GET /v1/models below the cap: %d", resp.StatusCode)
	}
}

// Silent connections in the reserve are closed after about a second
// (reservedHeaderTimeout), not header_timeout (a minute here), so they
// cannot keep probes out; a probe then finds a free slot and its answer.
func TestReservedConnectionHeaderTimeout(t *testing.T) {
	rg := newRig(t, 1, func(c *config.Config, _ *fleet.Config) {
		c.HTTP.HeaderTimeout = time.Minute
		c.HTTP.IdleTimeout = time.Minute
		c.HTTP.MaxConnections = 1
		c.HTTP.ReservedConnections = 2
	})
	addr := rg.runFront()
	open := func() float64 { return testutil.ToFloat64(rg.srv.lm.conns.WithLabelValues(listenerMain)) }
	dial(t, addr)
	pollGauge(t, "open connections", 1, open)
	silent := []net.Conn{dial(t, addr), dial(t, addr)}
	start := time.Now()
	for _, c := range silent {
		waitClosed(t, c, 10*time.Second, "silent reserved connection")
	}
	if d := time.Since(start); d < reservedHeaderTimeout/2 {
		t.Errorf("silent reserved connections closed after %v, want about %v", d, reservedHeaderTimeout)
	}
	pollGauge(t, "open connections after the silent ones", 1, open)
	c := dial(t, addr)
	if resp, _ := roundTrip(t, c, bufio.NewReader(c), "GET", "/health"); resp.StatusCode != 200 || !resp.Close {
		t.Fatalf("GET /health on a reserved connection: %d (close %v), want 200 and close", resp.StatusCode, resp.Close)
	}
}

// With the reserve full, a new connection takes the place of the oldest
// reserved one still silent (closed), skipping those whose request came;
// with none silent it is closed at accept. The bookkeeping stays bounded
// under a flood of silent connections.
func TestReserveDisplacesOldestSilent(t *testing.T) {
	l := &connLimit{max: 1, reserve: 2, headerWait: time.Hour, gauge: prometheus.NewGauge(prometheus.GaugeOpts{Name: "g"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "r"}, []string{"reason"})}
	type end struct{ ours, peer net.Conn }
	accept := func() end {
		ours, peer := net.Pipe()
		l.connContext(context.Background(), ours)
		return end{ours, peer}
	}
	closed := func(e end) bool {
		_ = e.peer.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
		_, err := e.peer.Read(make([]byte, 1))
		return errors.Is(err, io.EOF) || errors.Is(err, io.ErrClosedPipe)
	}
	gone := func(e end) { l.connState(e.ours, http.StateClosed) }
	served := accept()
	r1, r2 := accept(), accept() // the reserve
	r3 := accept()
	if !closed(r1) || closed(r2) || closed(r3) || closed(served) {
		t.Fatalf("a third reserved connection: closed r1 %v r2 %v r3 %v served %v, want only r1", closed(r1), closed(r2), closed(r3), closed(served))
	}
	gone(r1)
	if !l.arrived(r2.ours) {
		t.Fatal("r2's request: its timer was gone")
	}
	r4 := accept() // r2 has sent its request: r3 is the oldest silent one
	if !closed(r3) || closed(r2) || closed(r4) {
		t.Fatalf("after r2's request: closed r3 %v r2 %v r4 %v, want only r3", closed(r3), closed(r2), closed(r4))
	}
	gone(r3)
	l.arrived(r4.ours)
	r5 := accept() // no reserved connection silent: closed at accept
	if !closed(r5) {
		t.Fatal("a connection past a reserve that has all sent requests: not closed")
	}
	gone(r5)
	if n := testutil.ToFloat64(l.rejected.WithLabelValues("max_connections")); n != 3 {
		t.Errorf("rejected{max_connections} %v, want 3 (r1, r3 displaced; r5 closed)", n)
	}
	gone(r2)
	gone(r4)
	for range 1000 { // a flood of silent connections, each displacing the last
		e := accept()
		if len(l.order) > 2*int(l.reserve)+16 {
			t.Fatalf("%d connections in the reserve's order", len(l.order))
		}
		defer gone(e)
	}
	if len(l.waiting) != 2 {
		t.Errorf("%d reserved connections waiting after the flood, want 2", len(l.waiting))
	}
}
