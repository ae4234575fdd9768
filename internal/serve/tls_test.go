package serve

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kvrouter/internal/config"
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

// TestLoadServeTLSErrors: bad files stop start-up naming the field.
func TestLoadServeTLSErrors(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t, "ca")
	caFile, certFile, keyFile := ca.files(t, dir, "")
	_, _, otherKey := newTestCA(t, "other").files(t, dir, "other-")
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
