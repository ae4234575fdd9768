package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"kvrouter/internal/config"
	"kvrouter/internal/serve"
)

// TestServeTLSFlags: --tls-cert, --tls-key and --engine-ca set the tls
// fields (over the file's too), and serve fails before listening on a bad
// pair.
func TestServeTLSFlags(t *testing.T) {
	dir := t.TempDir()
	cfgFile := filepath.Join(dir, "router.yaml")
	if err := os.WriteFile(cfgFile, []byte("tls: {engine_ca_file: /from/file}\nmodels: [{name: m, tokenizer: none, engines: [{url: 'https://127.0.0.1:1'}]}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sio := stdio{out: io.Discard, err: io.Discard}
	fl, err := parseServeFlags([]string{"--model", "m", "--engine", "https://a:1", "--tls-cert", "c.pem", "--tls-key", "k.pem", "--engine-ca", "ca.pem"}, func(string) string { return "" }, sio)
	if err != nil {
		t.Fatal(err)
	}
	if got := fl.opts.Config.TLS; got != (config.TLS{CertFile: "c.pem", KeyFile: "k.pem", EngineCAFile: "ca.pem"}) {
		t.Errorf("quick form: %+v", got)
	}
	fl, err = parseServeFlags([]string{"--config", cfgFile, "--engine-ca", "ca2.pem"}, func(string) string { return "" }, sio)
	if err != nil {
		t.Fatal(err)
	}
	if fl.opts.Config.TLS.EngineCAFile != "ca2.pem" {
		t.Errorf("--engine-ca over the file: %+v", fl.opts.Config.TLS)
	}
	fl.opts.Config.TLS = config.TLS{CertFile: filepath.Join(dir, "missing.pem"), KeyFile: filepath.Join(dir, "missing.pem")}
	if _, err := serve.New(t.Context(), fl.opts); err == nil || !strings.Contains(err.Error(), "tls.cert_file") {
		t.Errorf("buildServe with a missing certificate: %v", err)
	}
}
