package serve

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"kvrouter/internal/config"
	"kvrouter/internal/testpki"
)

// TestLoadServeTLSErrors: bad files stop start-up naming the field.
func TestLoadServeTLSErrors(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA(t, "ca")
	caFile, certFile, keyFile := ca.Files(t, dir, "")
	_, _, otherKey := testpki.NewCA(t, "other").Files(t, dir, "other-")
	junk := filepath.Join(dir, "junk.pem")
	if err := os.WriteFile(junk, []byte("not pem"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		cfg  config.TLS
		want string // "" = no error
	}{
		{"good", config.TLS{CertFile: certFile, KeyFile: keyFile, EngineCAFile: caFile}, ""},
		{"cert without key", config.TLS{CertFile: certFile}, "cert_file (--tls-cert) and key_file (--tls-key) go together"},
		{"key of another cert", config.TLS{CertFile: certFile, KeyFile: otherKey}, "private key does not match public key"},
		{"missing cert file", config.TLS{CertFile: filepath.Join(dir, "nope.pem"), KeyFile: keyFile}, "tls.cert_file " + filepath.Join(dir, "nope.pem")},
		{"CA file without certificates", config.TLS{EngineCAFile: junk}, "tls.engine_ca_file (--engine-ca) " + junk + ": no PEM CERTIFICATE block"},
		{"CA file is a key", config.TLS{EngineCAFile: keyFile}, "no PEM CERTIFICATE block"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := loadServeTLS(tt.cfg)
			if tt.want == "" {
				if err != nil || got.listener == nil || got.engines == nil {
					t.Fatalf("%v %+v", err, got)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err %v, want %q", err, tt.want)
			}
		})
	}
}
