package proxy

import (
	"bufio"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"kvrouter/internal/testwait"
)

// TestNoForwardProxy: a CONNECT request gets an OpenAI-shaped 404 (the
// router is no forward proxy), and the UI serves only its two paths:
// another under /ui/ is the router's own 404, not the page's plain-text
// one.
func TestNoForwardProxy(t *testing.T) {
	ui := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("page")) })
	rg := newRig(t, 1)
	rg.srv.deps.UI = ui
	for _, h := range []http.Handler{rg.srv.routes(true), rg.srv.adminRoutes()} {
		checkNoForwardProxy(t, h)
	}
}

func checkNoForwardProxy(t *testing.T, h http.Handler) {
	t.Helper()
	front := httptest.NewServer(h)
	defer front.Close()
	client := front.Client()
	for _, req := range []string{
		"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n",
		"GET /ui/x HTTP/1.1\r\nHost: x\r\n\r\n",
	} {
		conn, err := net.Dial("tcp", strings.TrimPrefix(front.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		_ = conn.SetDeadline(time.Now().Add(testwait.Default))
		if _, err := conn.Write([]byte(req)); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("%q: %v", req, err)
		}
		body := readAll(t, resp)
		conn.Close()
		if e := errorOf(t, body); resp.StatusCode != 404 || e.Type != typeNotFound || resp.Header.Get("Content-Type") != "application/json" {
			t.Errorf("%q: %d %s %s, want an OpenAI-shaped 404", req, resp.StatusCode, resp.Header.Get("Content-Type"), body)
		}
	}
	for _, p := range []string{"/ui", "/ui/state"} {
		resp, err := client.Get(front.URL + p)
		if err != nil {
			t.Fatal(err)
		}
		if body := readAll(t, resp); resp.StatusCode != 200 || body != "page" {
			t.Errorf("GET %s: %d %q, want the UI's answer", p, resp.StatusCode, body)
		}
	}
}
