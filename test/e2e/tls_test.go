package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"kvrouter/internal/enginesim"
	"kvrouter/internal/testpki"
)

// startTLSSim runs an engine-sim serving HTTPS on loopback with a
// certificate from ca, and returns its https:// URL.
func startTLSSim(t *testing.T, ca *testpki.CA) string {
	t.Helper()
	certPEM, keyPEM := ca.Leaf(t)
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := enginesim.New(enginesim.Config{
		Core:            enginesim.CoreConfig{Profile: enginesim.ProfileFast, MaxModelLen: 32768, NumGPUBlocks: 4096},
		ServedModelName: "m",
	}, nil, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "https://" + ln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- srv.Serve(ctx, tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}}))
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("engine-sim: %v", err)
		}
	})
	return url
}

// syncLog is a log sink safe for concurrent writes.
type syncLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *syncLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *syncLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// serveLogged runs serve on loopback with the router.yaml text, logging
// into the returned sink, and returns its base URL (scheme from the
// configuration). Stopped when the test ends.
func serveLogged(t *testing.T, yaml string) (string, *syncLog) {
	t.Helper()
	logs := &syncLog{}
	t.Cleanup(func() { // registered first, so it runs after serve has stopped
		if t.Failed() {
			t.Logf("router log:\n%s", logs)
		}
	})
	return startServe(t, yaml, slog.New(slog.NewTextHandler(logs, nil))), logs
}

func tlsClient(t *testing.T, caPEM []byte) *http.Client {
	t.Helper()
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		t.Fatal("bad CA PEM")
	}
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}, Timeout: 10 * time.Second}
	t.Cleanup(c.CloseIdleConnections)
	return c
}

// TestServeTLS: kvrouter serves HTTPS with a certificate from the
// router's CA and reaches an https:// engine-sim through tls.engine_ca_file
// (the engines' CA): probes, the render tokenizer and the forwarded
// request all verify it. Everything is made in the test with crypto/x509.
func TestServeTLS(t *testing.T) {
	e2eLeakCheck(t)
	dir := t.TempDir()
	routerCA, engineCA := testpki.NewCA(t, "router CA"), testpki.NewCA(t, "engine CA")
	_, certFile, keyFile := routerCA.Files(t, dir, "router-")
	engineCAFile, _, _ := engineCA.Files(t, dir, "engine-")
	engine := startTLSSim(t, engineCA)
	url, _ := serveLogged(t, fmt.Sprintf(`health: {probe_interval: 100ms, scrape_interval: 200ms}
tls: {cert_file: %q, key_file: %q, engine_ca_file: %q}
models:
  - name: m
    tokenizer: render
    engines: [{name: e0, url: %q}]
`, certFile, keyFile, engineCAFile, engine))
	if !strings.HasPrefix(url, "https://") {
		t.Fatal(url)
	}
	c := tlsClient(t, routerCA.PEM())
	e2eEventually(t, 20*time.Second, "ready over https", func() bool {
		resp, err := c.Get(url + "/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	body := `{"model":"m","messages":[{"role":"user","content":"hello over TLS"}],"max_tokens":4}`
	resp, err := c.Post(url+"/v1/route", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Replica   string `json:"replica"`
		Tokenized bool   `json:"tokenized"`
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err := json.Unmarshal(b, &d); err != nil || d.Replica != "e0" || !d.Tokenized {
		t.Fatalf("/v1/route over TLS: %s (%v); want e0, tokenized by the engine's render endpoint", b, err)
	}
	resp, err = c.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"choices"`) {
		t.Fatalf("chat over TLS: %d %s", resp.StatusCode, b)
	}
	// A client that does not trust the router's CA is refused.
	if _, err := tlsClient(t, engineCA.PEM()).Get(url + "/health"); err == nil || !strings.Contains(err.Error(), "certificate signed by unknown authority") {
		t.Errorf("client without the router's CA: %v", err)
	}
}

// TestServeTLSWrongEngineCA: an engine whose certificate is not signed by
// tls.engine_ca_file never becomes ready, and the log says why in words.
func TestServeTLSWrongEngineCA(t *testing.T) {
	e2eLeakCheck(t)
	dir := t.TempDir()
	trusted, other := testpki.NewCA(t, "trusted CA"), testpki.NewCA(t, "other CA")
	caFile, _, _ := trusted.Files(t, dir, "")
	engine := startTLSSim(t, other)
	url, logs := serveLogged(t, fmt.Sprintf(`health: {probe_interval: 100ms}
tls: {engine_ca_file: %q}
models:
  - name: m
    tokenizer: none
    engines: [{name: e0, url: %q}]
`, caFile, engine))
	e2eEventually(t, 20*time.Second, "the probe failure logged", func() bool {
		return strings.Contains(logs.String(), "endpoint failed probe")
	})
	line := logs.String()
	for _, want := range []string{"x509: certificate signed by unknown authority",
		`hint="the engine's TLS certificate is not signed by a trusted CA: check the engine CA file"`} {
		if !strings.Contains(line, want) {
			t.Errorf("log lacks %q:\n%s", want, line)
		}
	}
	resp, err := http.Get(url + "/ready")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 503 {
		t.Errorf("/ready = %d with the engine's certificate untrusted, want 503", resp.StatusCode)
	}
	resp, body := (&e2eRouter{t: t, url: url, client: http.DefaultClient}).post("/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
	if resp.StatusCode != 503 || !strings.Contains(body, "no healthy replica") {
		t.Errorf("request: %d %s; want 503 no healthy replica (a TLS failure is definite: no panic routing)", resp.StatusCode, body)
	}
}
