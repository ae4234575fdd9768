package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"kvrouter/internal/enginesim"
	"kvrouter/internal/k8stest"
)

// runOut runs a command and returns its standard output; the error
// carries its standard error.
func runOut(t *testing.T, name string, args ...string) ([]byte, error) {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), name, args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, &cmdError{cmd: name + " " + strings.Join(args, " "), err: err, stderr: stderr.String()}
	}
	return out, nil
}

type cmdError struct {
	cmd, stderr string
	err         error
}

func (e *cmdError) Error() string { return e.cmd + ": " + e.err.Error() + "\n" + e.stderr }

// writeSlice creates or replaces EndpointSlice name of Service vllm in ns
// (port "http" 8000) with eps, as the EndpointSlice controller would.
func writeSlice(t *testing.T, cs kubernetes.Interface, ns, name string, eps ...discoveryv1.Endpoint) {
	t.Helper()
	port, pn := int32(8000), "http"
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{discoveryv1.LabelServiceName: "vllm"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &pn, Port: &port}},
		Endpoints:   eps,
	}
	api := cs.DiscoveryV1().EndpointSlices(ns)
	cur, err := api.Get(t.Context(), name, metav1.GetOptions{})
	if err == nil {
		s.ResourceVersion = cur.ResourceVersion
		_, err = api.Update(t.Context(), s, metav1.UpdateOptions{})
	} else {
		_, err = api.Create(t.Context(), s, metav1.CreateOptions{})
	}
	if err != nil {
		t.Fatalf("write endpointslice %s: %v", name, err)
	}
}

// kubeconfigFile writes a kubeconfig for the cluster's administrator.
func kubeconfigFile(t *testing.T, c *k8stest.Cluster) string {
	t.Helper()
	rc := c.Config()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	kc := fmt.Sprintf("apiVersion: v1\nkind: Config\nclusters: [{name: t, cluster: {server: %q, certificate-authority: %q}}]\n"+
		"users: [{name: a, user: {token: %q}}]\ncontexts: [{name: t, context: {cluster: t, user: a}}]\ncurrent-context: t\n",
		rc.Host, rc.CAFile, rc.BearerToken)
	if err := os.WriteFile(path, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// countedSim is an engine-sim in its own network namespace (a Pod's
// address) that counts the generation requests that reach it. A request
// with header X-Test-Hold waits (in flight at the engine) until Release;
// X-Test-Delay: DURATION delays it.
type countedSim struct {
	ip       string
	arrived  atomic.Int64 // generation requests received
	inFlight atomic.Int64 // of those, not answered yet
	release  chan struct{}
	released atomic.Bool
	auth     atomic.Value // string: the last generation request's Authorization header
}

// Release lets every held request (and later ones) go on.
func (s *countedSim) Release() {
	if s.released.CompareAndSwap(false, true) {
		close(s.release)
	}
}

func startCountedSim(t *testing.T) *countedSim { return startCountedSimPD(t, enginesim.PDConfig{}) }

// startCountedSimPD is startCountedSim with a simulated KV connector in
// pc's role (none when pc is zero); its side channel is on its address.
func startCountedSimPD(t *testing.T, pc enginesim.PDConfig) *countedSim {
	t.Helper()
	n := k8stest.NewNetNS(t)
	ln, err := n.Listen(8000)
	if err != nil {
		t.Fatal(err)
	}
	if pc.Role != "" {
		pc.SideChannelHost = n.Addr.String()
	}
	srv, err := enginesim.New(enginesim.Config{ServedModelName: "m", Core: enginesim.CoreConfig{NumGPUBlocks: 1024, MaxModelLen: 4096}, PD: pc}, nil, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	s := &countedSim{ip: n.Addr.String(), release: make(chan struct{})}
	// The sim's engine loop runs under Serve, on a loopback listener that
	// gets no traffic; the namespace's listener serves its handler behind
	// the counter.
	idle, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, idle) }()
	h := srv.Handler()
	hs := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && strings.HasPrefix(r.URL.Path, "/v1/") {
			s.arrived.Add(1)
			s.auth.Store(r.Header.Get("Authorization"))
			s.inFlight.Add(1)
			defer s.inFlight.Add(-1)
			if r.Header.Get("X-Test-Hold") != "" {
				select {
				case <-s.release:
				case <-r.Context().Done():
					return
				}
			}
			if d, err := time.ParseDuration(r.Header.Get("X-Test-Delay")); err == nil {
				select {
				case <-time.After(d):
				case <-r.Context().Done():
					return
				}
			}
		}
		h.ServeHTTP(w, r)
	})}
	go hs.Serve(ln)
	t.Cleanup(func() {
		s.Release()
		hs.Close()
		cancel()
		<-served
	})
	return s
}
