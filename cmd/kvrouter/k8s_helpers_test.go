package main

import (
	"os/exec"
	"strings"
	"testing"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
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
