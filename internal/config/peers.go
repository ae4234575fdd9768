package config

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"
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

// Peers says where a kvrouter replica finds its sibling router
// replicas: the Ready Pods matching Selector in Namespace. Its place is
// its own Pod's (PodName) position among them in name order, their count
// the number of routers (routing.Config.Routers and RouterIndex).
type Peers struct {
	// Namespace of the router Pods (kvrouter serve: default the
	// POD_NAMESPACE environment variable, else the ServiceAccount's).
	Namespace string `yaml:"namespace"`
	// Selector is a label selector matching the router Pods, all of them
	// and nothing else, e.g. the chart's
	// "app.kubernetes.io/name=kvrouter,app.kubernetes.io/instance=RELEASE".
	Selector string `yaml:"selector"`
	// PodName is this replica's own Pod (kvrouter serve: default the
	// POD_NAME environment variable, the downward API's metadata.name).
	PodName string `yaml:"pod_name"`
	// Resync is the watch's resync period (default 5m).
	Resync time.Duration `yaml:"resync"`
	// Kubeconfig as in Discovery (empty: in-cluster).
	Kubeconfig string `yaml:"kubeconfig"`
}

// Validate reports every problem of c at once: namespace, selector and
// pod_name are required, the selector must parse, resync be >= 0.
func (c Peers) Validate() error {
	var errs []error
	if c.Namespace == "" {
		errs = append(errs, errors.New("namespace: required"))
	}
	if c.Selector == "" {
		errs = append(errs, errors.New("selector: required"))
	} else if err := checkSelector(c.Selector); err != nil {
		errs = append(errs, fmt.Errorf("selector %q: %w", c.Selector, err))
	}
	if c.PodName == "" {
		errs = append(errs, errors.New("pod_name: required (set POD_NAME from the downward API's metadata.name)"))
	}
	if c.Resync < 0 {
		errs = append(errs, fmt.Errorf("resync %v: want >= 0", c.Resync))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("discovery: peers: %w", err)
	}
	return nil
}
