package serve

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"os"
	"time"

	"kvrouter/internal/config"
)

// serveTLS are the TLS settings of "kvrouter serve", loaded from files.
type serveTLS struct {
	// listener serves HTTPS on the listen address; nil: plain HTTP.
	listener *tls.Config
	// engines verifies https:// engines; nil: the system's roots.
	engines *tls.Config
}

// loadServeTLS reads the certificate, key and engine CA files named by c.
// Every problem is returned at once, naming the field (and flag).
func loadServeTLS(c config.TLS) (serveTLS, error) {
	var out serveTLS
	var errs []error
	switch {
	case (c.CertFile == "") != (c.KeyFile == ""):
		errs = append(errs, errors.New("tls: cert_file (--tls-cert) and key_file (--tls-key) go together"))
	case c.CertFile != "":
		cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
		if err != nil {
			errs = append(errs, fmt.Errorf("tls.cert_file %s, tls.key_file %s: %w", c.CertFile, c.KeyFile, err))
			break
		}
		out.listener = &tls.Config{
			Certificates: []tls.Certificate{cert},
			MinVersion:   tls.VersionTLS12,
			// HTTP/1.1, as to the engines: SSE streams flush per event.
			NextProtos: []string{"http/1.1"},
		}
	}
	if c.EngineCAFile != "" {
		pool, err := loadCAFile(c.EngineCAFile)
		if err != nil {
			errs = append(errs, fmt.Errorf("tls.engine_ca_file (--engine-ca) %w", err))
		} else {
			out.engines = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
		}
	}
	return out, errors.Join(errs...)
}

// loadCAFile reads PEM certificates into a pool; a file with none, or with
// a block that is not a valid certificate, is an error.
func loadCAFile(path string) (*x509.CertPool, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	n := 0
	for rest := data; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		cert, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%s: certificate %d: %w", path, n+1, err)
		}
		pool.AddCert(cert)
		n++
	}
	if n == 0 {
		return nil, fmt.Errorf("%s: no PEM CERTIFICATE block", path)
	}
	return pool, nil
}

// engineClient returns the HTTP client the tokenizers use to reach the
// engines: nil (their default) without an engine CA.
func (t serveTLS) engineClient() *http.Client {
	if t.engines == nil {
		return nil
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: t.engines, IdleConnTimeout: 90 * time.Second}}
}
