package discovery

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Config selects the engines of one model group. A zero field means the
// default in its comment.
type Config struct {
	// Namespace is the namespace watched (required).
	Namespace string `yaml:"namespace"`
	// Service names the Service whose EndpointSlices list the engines
	// (label kubernetes.io/service-name). Service or Selector is
	// required; with both, the engines are the Service's endpoints and
	// Selector narrows the Pods watched for annotations (endpoints of
	// other Pods are left out).
	Service string `yaml:"service"`
	// Selector is a Pod label selector, e.g. "app=vllm,model=llama-8b";
	// without Service the engines are the matching Pods that have an IP.
	Selector string `yaml:"selector"`
	// InferencePool names an InferencePool (inference.networking.k8s.io/v1)
	// in Namespace whose spec gives the engines: the Pods matching its
	// selector, on its first target port (the Gateway API Inference
	// Extension's pool; inferencepool.go). It excludes Service; Selector
	// may narrow the Pods watched; Port is ignored.
	InferencePool string `yaml:"inference_pool"`
	// Port is the engines' HTTP port: a port name (the EndpointSlice port
	// or container port of that name) or a number. Default: the
	// EndpointSlice's only port (slices with several are skipped with a
	// warning); for Pods, the first TCP container port, else 8000 (vllm
	// serve's).
	Port string `yaml:"port"`
	// PodAnnotations reads per-engine settings from the Pods' annotations
	// with a Service too (a Pod informer; RBAC list/watch pods). Always on
	// with Selector alone.
	PodAnnotations bool `yaml:"pod_annotations"`
	// Resync is the informers' resync period (5m); snapshots are rebuilt
	// then and sent only if they changed.
	Resync time.Duration `yaml:"resync"`
	// Defaults are the settings of engines whose Pod has no annotation for
	// them.
	Defaults Settings `yaml:"defaults"`
	// Kubeconfig is a kubeconfig file for running outside the cluster;
	// empty means the in-cluster ServiceAccount (RESTConfig).
	Kubeconfig string `yaml:"kubeconfig"`
	// Name labels this source's metrics (default "NAMESPACE/SERVICE" or
	// "NAMESPACE/SELECTOR").
	Name string `yaml:"name"`
}

// Settings are one engine's settings besides its address.
type Settings struct {
	// EventsPort is the KV event PUB port on the engine's IP (vLLM
	// --kv-events-config endpoint tcp://*:PORT); 0 means no events (the
	// router uses its approximate index).
	EventsPort int `yaml:"events_port"`
	// ReplayPort is the replay ROUTER port (replay_endpoint); 0 means gaps
	// cannot be replayed.
	ReplayPort int `yaml:"replay_port"`
	// DPSize is the data-parallel size: rank r publishes on the events
	// and replay ports + r (1).
	DPSize int `yaml:"dp_size"`
	// Topic is the KV events topic (--kv-events-config "topic"; "").
	Topic string `yaml:"topic"`
	// APIKeySecret names the Secret key holding the engine's API key
	// (none when Name is empty). Discovery reports the reference; reading
	// the Secret is the consumer's (RBAC get secrets).
	APIKeySecret SecretRef `yaml:"api_key_secret"`
}

// SecretRef names one key of a Secret in the source's namespace.
type SecretRef struct {
	Name string `yaml:"name"`
	Key  string `yaml:"key"`
}

// maxDPSize bounds dp_size, as router.yaml's engines are bounded.
const maxDPSize = 1024

// defaultPort is vllm serve's --port.
const defaultPort = 8000

// withDefaults fills zero fields and returns every problem at once.
func (c Config) withDefaults() (Config, error) {
	var errs []error
	if c.Namespace == "" {
		errs = append(errs, errors.New("discovery: namespace is required"))
	} else if msgs := validation.IsDNS1123Label(c.Namespace); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("discovery: namespace %q: %s", c.Namespace, msgs[0]))
	}
	switch {
	case c.InferencePool != "" && c.Service != "":
		errs = append(errs, errors.New("discovery: inference_pool excludes service"))
	case c.InferencePool != "":
		if msgs := validation.IsDNS1123Subdomain(c.InferencePool); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("discovery: inference_pool %q: %s", c.InferencePool, msgs[0]))
		}
	case c.Service == "" && c.Selector == "":
		errs = append(errs, errors.New("discovery: service, selector or inference_pool is required"))
	}
	if c.Service != "" {
		if msgs := validation.IsDNS1035Label(c.Service); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("discovery: service %q: %s", c.Service, msgs[0]))
		}
	}
	if c.Selector != "" {
		if _, err := labels.Parse(c.Selector); err != nil {
			errs = append(errs, fmt.Errorf("discovery: selector %q: %w", c.Selector, err))
		}
	}
	if c.Service == "" {
		c.PodAnnotations = true
	}
	if c.Port != "" {
		if n, err := strconv.Atoi(c.Port); err == nil {
			if n < 1 || n > 65535 {
				errs = append(errs, fmt.Errorf("discovery: port %d out of range", n))
			}
		} else if msgs := validation.IsValidPortName(c.Port); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("discovery: port %q: %s", c.Port, msgs[0]))
		}
	}
	if c.Resync == 0 {
		c.Resync = 5 * time.Minute
	} else if c.Resync < 0 {
		errs = append(errs, fmt.Errorf("discovery: resync %s is negative", c.Resync))
	}
	if c.Defaults.DPSize == 0 {
		c.Defaults.DPSize = 1
	}
	if err := c.Defaults.check(); err != nil {
		errs = append(errs, fmt.Errorf("discovery: defaults: %w", err))
	}
	if c.Defaults.ReplayPort != 0 && c.Defaults.EventsPort == 0 {
		// As for router.yaml's engines; a Pod's annotation may still turn
		// its events off (events-port "0") and leave the default replay.
		errs = append(errs, fmt.Errorf("discovery: defaults: replay_port %d needs events_port", c.Defaults.ReplayPort))
	}
	if c.Name == "" && c.InferencePool != "" {
		c.Name = c.Namespace + "/inferencepool/" + c.InferencePool
	}
	if c.Name == "" {
		c.Name = c.Namespace + "/" + c.Service
		if c.Service == "" {
			c.Name = c.Namespace + "/" + c.Selector
		}
	}
	return c, errors.Join(errs...)
}

// check reports settings no engine can have.
func (s Settings) check() error {
	var errs []error
	for _, p := range []struct {
		name string
		v    int
	}{{"events_port", s.EventsPort}, {"replay_port", s.ReplayPort}} {
		if p.v < 0 || p.v > 65535 {
			errs = append(errs, fmt.Errorf("%s %d out of range", p.name, p.v))
		}
	}
	if s.DPSize < 1 || s.DPSize > maxDPSize {
		errs = append(errs, fmt.Errorf("dp_size %d: want 1..%d", s.DPSize, maxDPSize))
	}
	if s.EventsPort != 0 && s.EventsPort+s.DPSize-1 > 65535 {
		errs = append(errs, fmt.Errorf("events_port %d + dp_size %d passes 65535", s.EventsPort, s.DPSize))
	}
	if s.ReplayPort != 0 && s.ReplayPort+s.DPSize-1 > 65535 {
		errs = append(errs, fmt.Errorf("replay_port %d + dp_size %d passes 65535", s.ReplayPort, s.DPSize))
	}
	if s.EventsPort != 0 && s.ReplayPort != 0 && s.EventsPort < s.ReplayPort+s.DPSize && s.ReplayPort < s.EventsPort+s.DPSize {
		errs = append(errs, fmt.Errorf("events ports %d+%d overlap replay ports %d+%d", s.EventsPort, s.DPSize, s.ReplayPort, s.DPSize))
	}
	if (s.APIKeySecret.Name == "") != (s.APIKeySecret.Key == "") {
		errs = append(errs, fmt.Errorf("api_key_secret needs both name and key, got %q/%q", s.APIKeySecret.Name, s.APIKeySecret.Key))
	}
	return errors.Join(errs...)
}

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

// Validate reports every problem of c at once, as New would (nil: fine).
func (c Config) Validate() error {
	_, err := c.withDefaults()
	return err
}
