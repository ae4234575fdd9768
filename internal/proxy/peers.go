package proxy

import (
	"fmt"
	"os"
	"strings"
)

// serviceAccountNamespace is where Kubernetes mounts the Pod's namespace.
const serviceAccountNamespace = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// fillPeers fills a peers block's Pod name and namespace from the
// environment (POD_NAME, POD_NAMESPACE: the downward API) and, for the
// namespace, the ServiceAccount's mounted file.
func (c *Config) fillPeers(getenv func(string) string) {
	p := c.Peers
	if p == nil {
		return
	}
	if p.PodName == "" {
		p.PodName = getenv("POD_NAME")
	}
	if p.Namespace == "" {
		p.Namespace = getenv("POD_NAMESPACE")
	}
	if p.Namespace == "" {
		if b, err := os.ReadFile(serviceAccountNamespace); err == nil {
			p.Namespace = strings.TrimSpace(string(b))
		}
	}
}

// validatePeers: a peers block sets every model group's routers and
// router_index, so neither may be set by hand too.
func (c *Config) validatePeers() []error {
	if c.Peers == nil {
		return nil
	}
	var errs []error
	if err := c.Peers.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("peers: %w", err))
	}
	for i, m := range c.Models {
		if m.Routing.Routers != 0 || m.Routing.RouterIndex != 0 {
			errs = append(errs, fmt.Errorf("models[%d] (%s): routing.routers and router_index are set by peers; remove them", i, m.Name))
		}
	}
	return errs
}
