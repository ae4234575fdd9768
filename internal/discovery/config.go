package discovery

import (
	"fmt"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// defaultPort is vllm serve's --port.
const defaultPort = 8000

// RESTConfig returns the client configuration for kubeconfig, a file
// path, or, when it is empty, the in-cluster ServiceAccount's
// (KUBERNETES_SERVICE_HOST and the mounted token).
func RESTConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		rc, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("discovery: in-cluster config (set kubeconfig when running outside Kubernetes): %w", err)
		}
		return rc, nil
	}
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("discovery: kubeconfig %s: %w", kubeconfig, err)
	}
	return rc, nil
}
