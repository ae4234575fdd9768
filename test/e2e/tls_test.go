package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"kvrouter/internal/enginesim"
)

// testCA is a certificate authority made in the test with crypto/x509.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// leaf issues a server certificate for 127.0.0.1 and returns it with its
// key, in PEM.
func (ca *testCA) leaf(t *testing.T) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "127.0.0.1"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

// files writes the CA and a fresh leaf into dir and returns their paths.
func (ca *testCA) files(t *testing.T, dir, prefix string) (caFile, certFile, keyFile string) {
	t.Helper()
	c, k := ca.leaf(t)
	caFile, certFile, keyFile = filepath.Join(dir, prefix+"ca.pem"), filepath.Join(dir, prefix+"cert.pem"), filepath.Join(dir, prefix+"key.pem")
	for p, b := range map[string][]byte{caFile: ca.pem, certFile: c, keyFile: k} {
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return caFile, certFile, keyFile
}

// startTLSSim runs an engine-sim serving HTTPS on loopback with a
// certificate from ca, and returns its https:// URL.
func startTLSSim(t *testing.T, ca *testCA) string {
	t.Helper()
	certPEM, keyPEM := ca.leaf(t)
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
	routerCA, engineCA := newTestCA(t, "router CA"), newTestCA(t, "engine CA")
	_, certFile, keyFile := routerCA.files(t, dir, "router-")
	engineCAFile, _, _ := engineCA.files(t, dir, "engine-")
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
	c := tlsClient(t, routerCA.pem)
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
	if _, err := tlsClient(t, engineCA.pem).Get(url + "/health"); err == nil || !strings.Contains(err.Error(), "certificate signed by unknown authority") {
		t.Errorf("client without the router's CA: %v", err)
	}
}

// TestServeTLSWrongEngineCA: an engine whose certificate is not signed by
// tls.engine_ca_file never becomes ready, and the log says why in words.
func TestServeTLSWrongEngineCA(t *testing.T) {
	e2eLeakCheck(t)
	dir := t.TempDir()
	trusted, other := newTestCA(t, "trusted CA"), newTestCA(t, "other CA")
	caFile, _, _ := trusted.files(t, dir, "")
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
