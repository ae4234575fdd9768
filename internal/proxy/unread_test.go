package proxy

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"kvrouter/internal/config"
	"kvrouter/internal/fleet"
)

// answerOn writes raw (a request's head and what part of its body the
// client sends) on a new connection to addr and reads the answer, failing
// unless one comes within 10 s.
func answerOn(t *testing.T, addr, what, raw string) (net.Conn, *http.Response, string) {
	t.Helper()
	c := dial(t, addr)
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatalf("%s: write: %v", what, err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("%s: no answer within 10 s: %v", what, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return c, resp, string(b)
}

// Every answer that leaves a declared request body unread closes the
// connection promptly ("Connection: close"), however the client stalls:
// none of header_timeout, body_idle_timeout or idle_timeout (a minute
// here) is what ends it. A whole request keeps its connection.
func TestUnreadBodyClosesConnection(t *testing.T) {
	rg := newRig(t, 1, func(c *config.Config, _ *fleet.Config) {
		c.HTTP.HeaderTimeout = time.Minute
		c.HTTP.IdleTimeout = time.Minute
		c.HTTP.BodyIdleTimeout = 300 * time.Millisecond
	})
	addr := rg.runFront()
	const declared = "Host: kvrouter\r\nContent-Length: 1000\r\n"
	for _, tc := range []struct {
		name, raw string
		status    int
	}{
		{"body stalled mid-upload", "POST /v1/chat/completions HTTP/1.1\r\n" + declared + "Content-Type: application/json\r\n\r\n" + `{"model":"m",`, http.StatusRequestTimeout},
		{"wrong Content-Type, no body", "POST /v1/chat/completions HTTP/1.1\r\n" + declared + "Content-Type: text/plain\r\n\r\n", http.StatusBadRequest},
		{"unknown path, no body", "POST /v1/nowhere HTTP/1.1\r\n" + declared + "Content-Type: application/json\r\n\r\n", http.StatusNotFound},
		{"GET /v1/models with a declared body", "GET /v1/models HTTP/1.1\r\n" + declared + "\r\n", http.StatusOK},
		{"chunked body never ended", "POST /v1/nowhere HTTP/1.1\r\nHost: kvrouter\r\nTransfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\n10\r\n0123456789", http.StatusNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, resp, _ := answerOn(t, addr, tc.name, tc.raw)
			if resp.StatusCode != tc.status {
				t.Errorf("%s: %d, want %d", tc.name, resp.StatusCode, tc.status)
			}
			if !resp.Close {
				t.Errorf("%s: answer without Connection: close", tc.name)
			}
			waitClosed(t, c, 10*time.Second, tc.name)
		})
	}
	t.Run("whole request", func(t *testing.T) {
		c, resp, _ := answerOn(t, addr, "whole request", "POST /v1/chat/completions HTTP/1.1\r\nHost: kvrouter\r\nContent-Type: application/json\r\nContent-Length: "+strconv.Itoa(len(chatBody))+"\r\n\r\n"+chatBody)
		if resp.StatusCode != 200 || resp.Close {
			t.Fatalf("whole request: %d (close %v), want 200 on a kept-alive connection", resp.StatusCode, resp.Close)
		}
		c.Close()
	})
}

// A non-probe request with a declared body on a reserved connection gets
// its 503 and the connection closes.
func TestReservedUnreadBodyClosesConnection(t *testing.T) {
	rg := newRig(t, 1, func(c *config.Config, _ *fleet.Config) {
		c.HTTP.HeaderTimeout = time.Minute
		c.HTTP.IdleTimeout = time.Minute
		c.HTTP.MaxConnections = 1
		c.HTTP.ReservedConnections = 2
	})
	addr := rg.runFront()
	holder := dial(t, addr)
	if resp, _ := roundTrip(t, holder, bufio.NewReader(holder), "GET", "/health"); resp.StatusCode != 200 {
		t.Fatalf("GET /health below the cap: %d", resp.StatusCode)
	}
	c, resp, _ := answerOn(t, addr, "POST on a reserved connection",
		"POST /v1/chat/completions HTTP/1.1\r\nHost: kvrouter\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n")
	if resp.StatusCode != http.StatusServiceUnavailable || !resp.Close {
		t.Fatalf("POST on a reserved connection: %d (close %v), want 503 and Connection: close", resp.StatusCode, resp.Close)
	}
	waitClosed(t, c, 10*time.Second, "reserved connection after its 503")
}

// A path that is not in canonical form gets an OpenAI-shaped 404 on both
// listeners, never ServeMux's redirect to the cleaned path, and reaches no
// engine.
func TestNonCanonicalPath(t *testing.T) {
	rg := newRig(t, 1, func(c *config.Config, _ *fleet.Config) { c.AdminListen = "127.0.0.1:0" })
	for _, l := range []struct{ name, addr string }{{"main", rg.runFront()}, {"admin", rg.runListener(rg.srv.RunAdmin)}} {
		for _, p := range []string{"/v1/responses/../../reset_prefix_cache", "//v1/models", "/v1/./models", "/health/..", "/v1//chat/completions"} {
			for _, m := range []string{"GET", "POST"} {
				what := l.name + " " + m + " " + p
				_, resp, body := answerOn(t, l.addr, what, m+" "+p+" HTTP/1.1\r\nHost: kvrouter\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
				if resp.Header.Get("Location") != "" {
					t.Errorf("%s: redirected to %q", what, resp.Header.Get("Location"))
				}
				openAIError(t, what, resp, body, http.StatusNotFound, typeNotFound)
			}
		}
	}
	if n := rg.engines[0].requests.Load(); n != 0 {
		t.Errorf("engine saw %d requests, want 0", n)
	}
}

// The documented exceptions to OpenAI-shaped refusals: a malformed,
// negative or repeated Content-Length is answered by net/http itself,
// before any handler, with a plain-text 400, and the connection closes.
func TestContentLengthRefusedByNetHTTP(t *testing.T) {
	rg := newRig(t, 1)
	addr := rg.runFront()
	for _, cl := range []string{"Content-Length: -1\r\n", "Content-Length: 1x\r\n", "Content-Length: 2\r\nContent-Length: 3\r\n"} {
		what := strings.TrimSpace(strings.ReplaceAll(cl, "\r\n", " "))
		c, resp, body := answerOn(t, addr, what, "POST /v1/chat/completions HTTP/1.1\r\nHost: kvrouter\r\nContent-Type: application/json\r\n"+cl+"\r\n{}")
		if resp.StatusCode != http.StatusBadRequest || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") {
			t.Errorf("%s: %d %s %q, want net/http's plain-text 400", what, resp.StatusCode, resp.Header.Get("Content-Type"), body)
		}
		waitClosed(t, c, 10*time.Second, what)
	}
}

// Uploads that declare large bodies and send a few bytes hold a few KiB
// of body_budget each, not what they declared: a whole request still gets
// its answer while they stall.
func TestBodyBudgetTakenAsBytesArrive(t *testing.T) {
	const limit, budget, n = 64 << 10, 256 << 10, 32
	rg := newRig(t, 1, func(c *config.Config, _ *fleet.Config) {
		c.BodyLimit, c.BodyBudget = limit, budget
		c.HTTP.BodyIdleTimeout = time.Minute
	})
	addr := rg.runFront()
	held := func() float64 { return testutil.ToFloat64(rg.srv.lm.bodies) }
	for range n {
		startUpload(t, addr, limit, `{"model":"m","messages":[{"role":"user","content":"`)
	}
	pollGauge(t, "kvrouter_proxy_body_held_bytes with the uploads stalled", n*bodyChunk, held)
	if resp, body := rawPost(t, addr, chatBody); resp.StatusCode != 200 {
		t.Fatalf("a whole request while %d uploads declaring %d bytes stall: %d %s", n, limit, resp.StatusCode, body)
	}
}

// A body that keeps coming, a byte at a time, is answered 408 at
// body_timeout (body_idle_timeout never passes), its connection closed and
// its budget given back.
func TestBodyTimeout(t *testing.T) {
	rg := newRig(t, 1, func(c *config.Config, _ *fleet.Config) {
		c.HTTP.BodyIdleTimeout = time.Minute
		c.HTTP.BodyTimeout = time.Second
	})
	addr := rg.runFront()
	c := startUpload(t, addr, 1<<10, `{"model":"m","messages":[`)
	// Trickle: a byte every 50 ms until the answer (or 20 s).
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				if _, err := c.Write([]byte(" ")); err != nil {
					return
				}
			}
		}
	}()
	defer func() { close(stop); <-done }()
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	start := time.Now()
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("a trickling body: no answer within 20 s: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	e := openAIError(t, "a trickling body", resp, string(b), http.StatusRequestTimeout, typeInvalidRequest)
	if d := time.Since(start); d < time.Second/2 || !strings.Contains(e.Message, "body_timeout") || !resp.Close {
		t.Errorf("a trickling body: answered after %v: %q (close %v), want body_timeout's 408 and close", d, e.Message, resp.Close)
	}
	if n := testutil.ToFloat64(rg.srv.lm.bodyRej.WithLabelValues("timeout")); n != 1 {
		t.Errorf("body_rejected_total{reason=timeout} = %v, want 1", n)
	}
	pollGauge(t, "kvrouter_proxy_body_held_bytes", 0, func() float64 { return testutil.ToFloat64(rg.srv.lm.bodies) })
}

// Bodies read in several parts arrive whole at the engine, with a
// declared length and chunked, and give their budget back.
func TestBodyReadInParts(t *testing.T) {
	rg := newRig(t, 1)
	addr := rg.runFront()
	content := strings.Repeat("0123456789abcdef", 100<<10/16+7) // ~100 KiB: many parts
	body := `{"model":"m","messages":[{"role":"user","content":"` + content + `"}]}`
	for _, te := range []string{"Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body,
		"Transfer-Encoding: chunked\r\n\r\n" + strconv.FormatInt(int64(len(body)), 16) + "\r\n" + body + "\r\n0\r\n\r\n"} {
		c, resp, got := answerOn(t, addr, "a 100 KiB body", "POST /v1/chat/completions HTTP/1.1\r\nHost: kvrouter\r\nContent-Type: application/json\r\n"+te)
		c.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("a 100 KiB body: %d %s", resp.StatusCode, got)
		}
		if !strings.Contains(string(rg.engines[0].lastBody()), content) {
			t.Fatalf("the engine got a body of %d bytes without the content sent", len(rg.engines[0].lastBody()))
		}
	}
	pollGauge(t, "kvrouter_proxy_body_held_bytes", 0, func() float64 { return testutil.ToFloat64(rg.srv.lm.bodies) })
}
