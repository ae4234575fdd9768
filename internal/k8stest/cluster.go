package k8stest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Options selects how Start configures kube-apiserver.
type Options struct {
	// RBAC runs --authorization-mode RBAC; false runs AlwaysAllow.
	RBAC bool
	// BindAddress is the address kube-apiserver listens on and advertises;
	// default 127.0.0.1. A node's Pods need one they can reach (StartNode).
	BindAddress string
	// ServiceCIDR is --service-cluster-ip-range; default 10.0.0.0/24.
	ServiceCIDR string
}

// Cluster is an etcd and a kube-apiserver on loopback. Safe for concurrent
// use.
type Cluster struct {
	dir     string
	bins    binaries
	opt     Options
	etcdURL string
	port    int    // kube-apiserver's secure port, kept across restarts
	token   string // the administrator's bearer token

	mu        sync.Mutex
	etcd      *proc
	apiserver *proc
}

const (
	readyTimeout = 120 * time.Second // kube-apiserver's first /readyz on a loaded 2-core machine
	stopGrace    = 10 * time.Second
	// apiserverGrace is how long StopAPIServer waits after SIGTERM.
	apiserverGrace = 3 * time.Second
)

// Start runs etcd and kube-apiserver for the test and stops them and
// removes their files on t.Cleanup. It skips under -short, skips (or fails,
// see RequiredEnv) when a binary is missing, and fails when the control plane does not come
// up within two minutes.
func Start(t testing.TB, opt Options) *Cluster {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: starts etcd and kube-apiserver")
	}
	bins, err := findBinaries()
	if err != nil {
		unavailable(t, err.Error(), fixBinaries)
	}
	if opt.BindAddress == "" {
		opt.BindAddress = "127.0.0.1"
	}
	if opt.ServiceCIDR == "" {
		opt.ServiceCIDR = "10.0.0.0/24"
	}
	c := &Cluster{dir: t.TempDir(), bins: bins, opt: opt}
	t.Cleanup(c.stop)
	if err := c.start(); err != nil {
		t.Fatalf("k8stest: %v", err)
	}
	return c
}

// start brings up etcd, writes the credentials and starts kube-apiserver.
func (c *Cluster) start() error {
	var err error
	for try := 0; try < 3; try++ { // a port picked free may be taken meanwhile
		if err = c.startEtcd(); err == nil {
			break
		}
	}
	if err != nil {
		return err
	}
	if err := c.writeCredentials(); err != nil {
		return err
	}
	for try := 0; try < 3; try++ {
		ports, perr := freePorts(1)
		if perr != nil {
			return perr
		}
		c.port = ports[0]
		if err = c.StartAPIServer(); err == nil || !c.portTaken() {
			return err
		}
	}
	return err
}

// portTaken reports whether kube-apiserver's log says its port was in use.
func (c *Cluster) portTaken() bool {
	b, _ := os.ReadFile(filepath.Join(c.dir, "kube-apiserver.log"))
	return bytes.Contains(b, []byte("address already in use"))
}

func (c *Cluster) startEtcd() error {
	ports, err := freePorts(2)
	if err != nil {
		return err
	}
	client := "http://127.0.0.1:" + strconv.Itoa(ports[0])
	peer := "http://127.0.0.1:" + strconv.Itoa(ports[1])
	data := filepath.Join(c.dir, "etcd")
	os.RemoveAll(data)
	p, err := startProc("etcd", filepath.Join(c.dir, "etcd.log"), c.bins.etcd,
		"--name", "default", "--data-dir", data,
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "default="+peer)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.etcd = p
	c.etcdURL = client
	c.mu.Unlock()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if p.exited() {
			return fmt.Errorf("etcd %w: %v\n%s", errExited, p.err, p.tail(2000))
		}
		resp, err := http.Get(client + "/health")
		if err == nil {
			ok := resp.StatusCode == http.StatusOK
			resp.Body.Close()
			if ok {
				return nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	p.stop(stopGrace)
	return fmt.Errorf("etcd not healthy after 30s:\n%s", p.tail(2000))
}

// writeCredentials writes the service-account signing key and the static
// token file (one administrator in system:masters).
func (c *Cluster) writeCredentials() error {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return err
	}
	priv := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})
	if err := os.WriteFile(filepath.Join(c.dir, "sa.key"), priv, 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(c.dir, "sa.pub"), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o644); err != nil {
		return err
	}
	tok := make([]byte, 16)
	rand.Read(tok)
	c.token = hex.EncodeToString(tok)
	return os.WriteFile(filepath.Join(c.dir, "tokens.csv"), []byte(c.token+",admin,admin,system:masters\n"), 0o600)
}

// StartAPIServer starts kube-apiserver (again, after StopAPIServer) on the
// cluster's port and waits for /readyz.
func (c *Cluster) StartAPIServer() error {
	mode := "AlwaysAllow"
	if c.opt.RBAC {
		mode = "Node,RBAC"
	}
	p, err := startProc("kube-apiserver", filepath.Join(c.dir, "kube-apiserver.log"), c.bins.apiserver,
		"--etcd-servers", c.etcdURL,
		"--bind-address", c.opt.BindAddress, "--secure-port", strconv.Itoa(c.port),
		"--cert-dir", filepath.Join(c.dir, "certs"),
		"--token-auth-file", filepath.Join(c.dir, "tokens.csv"),
		"--authorization-mode", mode,
		"--service-account-issuer", "https://kubernetes.default.svc",
		"--service-account-key-file", filepath.Join(c.dir, "sa.pub"),
		"--service-account-signing-key-file", filepath.Join(c.dir, "sa.key"),
		"--service-cluster-ip-range", c.opt.ServiceCIDR)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.apiserver = p
	c.mu.Unlock()
	deadline := time.Now().Add(readyTimeout)
	for time.Now().Before(deadline) {
		if p.exited() {
			return fmt.Errorf("kube-apiserver %w: %v\n%s", errExited, p.err, p.tail(3000))
		}
		if c.ready() {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	p.stop(stopGrace)
	return fmt.Errorf("kube-apiserver not ready after %s:\n%s", readyTimeout, p.tail(3000))
}

// ready asks /readyz with the administrator's token.
func (c *Cluster) ready() bool {
	hc, err := rest.HTTPClientFor(c.Config())
	if err != nil {
		return false
	}
	defer hc.CloseIdleConnections()
	resp, err := hc.Get(c.URL() + "/readyz")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	return resp.StatusCode == http.StatusOK
}

// StopAPIServer stops kube-apiserver; etcd keeps running. Clients see
// their connections drop and their watches end. kube-apiserver stops
// listening within a fraction of a second of SIGTERM but, with watches
// open, lingers for more than 10 s; it is killed after apiserverGrace.
func (c *Cluster) StopAPIServer() {
	c.mu.Lock()
	p := c.apiserver
	c.mu.Unlock()
	if p != nil {
		p.stop(apiserverGrace)
	}
}

// stop ends both processes (the temporary directory goes with the test).
func (c *Cluster) stop() {
	c.StopAPIServer()
	c.mu.Lock()
	p := c.etcd
	c.mu.Unlock()
	if p != nil {
		p.stop(stopGrace)
	}
}

// URL is kube-apiserver's base URL, https://BIND_ADDRESS:PORT (default
// https://127.0.0.1:PORT).
func (c *Cluster) URL() string {
	return "https://" + net.JoinHostPort(c.opt.BindAddress, strconv.Itoa(c.port))
}

// Config is a rest.Config for the administrator (system:masters). The
// server's certificate is checked against the one kube-apiserver wrote to
// its cert dir.
func (c *Cluster) Config() *rest.Config {
	return c.tokenConfig(c.token)
}

// tokenConfig is a rest.Config with a bearer token.
func (c *Cluster) tokenConfig(token string) *rest.Config {
	return &rest.Config{
		Host:        c.URL(),
		BearerToken: token,
		TLSClientConfig: rest.TLSClientConfig{
			CAFile: filepath.Join(c.dir, "certs", "apiserver.crt"),
		},
		QPS: -1, // no client-side rate limit: tests time the server, not a token bucket
	}
}

// ServiceAccountConfig creates namespace ns and ServiceAccount name in it
// when missing and returns a rest.Config with a token for it from the
// TokenRequest API, as a Pod running under that ServiceAccount gets.
func (c *Cluster) ServiceAccountConfig(ctx context.Context, ns, name string) (*rest.Config, error) {
	cs, err := kubernetes.NewForConfig(c.Config())
	if err != nil {
		return nil, err
	}
	if err := c.CreateNamespace(ctx, ns); err != nil {
		return nil, err
	}
	if err := createServiceAccount(ctx, cs, ns, name); err != nil {
		return nil, err
	}
	exp := int64(3600)
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &exp}}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("token for serviceaccount %s/%s: %w", ns, name, err)
	}
	return c.tokenConfig(tr.Status.Token), nil
}

// CreateNamespace creates namespace ns, if missing, and its "default"
// ServiceAccount, which Pods need and kube-controller-manager (not run
// here) would create.
func (c *Cluster) CreateNamespace(ctx context.Context, ns string) error {
	cs, err := kubernetes.NewForConfig(c.Config())
	if err != nil {
		return err
	}
	_, err = cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create namespace %s: %w", ns, err)
	}
	return createServiceAccount(ctx, cs, ns, "default")
}

func createServiceAccount(ctx context.Context, cs kubernetes.Interface, ns, name string) error {
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}
	_, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, sa, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create serviceaccount %s/%s: %w", ns, name, err)
	}
	return nil
}

// EtcdDelete deletes key from etcd directly (etcd's v3 JSON gateway), as
// another kube-apiserver of the same cluster would while this one is
// down. Keys are kube-apiserver's, e.g.
// /registry/endpointslices/NAMESPACE/NAME. It returns how many keys went.
func (c *Cluster) EtcdDelete(ctx context.Context, key string) (int, error) {
	body, _ := json.Marshal(map[string]string{"key": base64.StdEncoding.EncodeToString([]byte(key))})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.etcdURL+"/v3/kv/deleterange", bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("etcd deleterange %s: %s: %s", key, resp.Status, b)
	}
	var out struct {
		Deleted string `json:"deleted"`
	}
	if err := json.Unmarshal(b, &out); err != nil {
		return 0, fmt.Errorf("etcd deleterange %s: %w: %s", key, err, b)
	}
	if out.Deleted == "" {
		return 0, nil
	}
	return strconv.Atoi(out.Deleted)
}

// Log returns the end of kube-apiserver's log, for failure messages.
func (c *Cluster) Log() string {
	c.mu.Lock()
	p := c.apiserver
	c.mu.Unlock()
	if p == nil {
		return ""
	}
	return p.tail(4000)
}
