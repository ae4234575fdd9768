package config

import (
	"errors"
	"fmt"
	"strconv"
	"time"
)

// Discovery selects the engines of one model group from Kubernetes
// (router.yaml models[i].discovery; package discovery watches them). A
// zero field means the default in its comment.
type Discovery struct {
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
	// Extension's pool; discovery/inferencepool.go). It excludes Service; Selector
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
	// SecretRefresh is how often the API-key Secrets that engines
	// reference (EngineSettings.APIKeySecret) are read again to follow a
	// rotated key (1m). A reference seen for the first time is read at
	// once. Reading needs RBAC get on those Secrets.
	SecretRefresh time.Duration `yaml:"secret_refresh"`
	// Defaults are the settings of engines whose Pod has no annotation for
	// them.
	Defaults EngineSettings `yaml:"defaults"`
	// Kubeconfig is a kubeconfig file for running outside the cluster;
	// empty means the in-cluster ServiceAccount (discovery.RESTConfig).
	Kubeconfig string `yaml:"kubeconfig"`
	// Name labels this source's metrics (default "NAMESPACE/SERVICE" or
	// "NAMESPACE/SELECTOR").
	Name string `yaml:"name"`
	// RoleLabel is the Pod label giving an engine's disaggregated-serving
	// role (discovery.Engine.Role): default DefaultRoleLabel
	// (llm-d.ai/role), "-" for none. Pods labelled prefill form the
	// group's prefill pool, the others its decode pool; a group with no
	// prefill Pod serves whole requests. It needs the Pods: a Selector or
	// InferencePool source, or PodAnnotations with a Service.
	RoleLabel string `yaml:"role_label"`
}

// EngineSettings are one discovered engine's settings besides its
// address: Discovery.Defaults, overlaid per Pod by its annotations.
type EngineSettings struct {
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
	// (none when Name is empty). The discovery.Source reads it (RBAC get on that
	// Secret) and reports the key as discovery.Engine.APIKey.
	APIKeySecret SecretRef `yaml:"api_key_secret"`
}

// SecretRef names one key of a Secret in the source's namespace.
type SecretRef struct {
	// Name is the Secret's name ("": no key).
	Name string `yaml:"name"`
	// Key is the key within the Secret's data.
	Key string `yaml:"key"`
}

// MaxDPSize bounds a discovered engine's dp_size (Discovery.Defaults and
// the Pod annotation kvrouter/dp-size).
const MaxDPSize = 1024

// DiscoveryError is one problem of a Discovery block, naming its field by its yaml
// path inside the discovery block, e.g. "defaults.dp_size".
type DiscoveryError struct {
	// Field is the yaml path: "namespace", "defaults.replay_port", ...
	Field string
	// Msg says what is wrong with the value.
	Msg string
}

// Error returns "discovery: FIELD: MSG".
func (e *DiscoveryError) Error() string { return "discovery: " + e.Field + ": " + e.Msg }

func fieldErr(field, format string, a ...any) error {
	return &DiscoveryError{Field: field, Msg: fmt.Sprintf(format, a...)}
}

// WithDefaults fills zero fields and returns every problem at once, each a
// *DiscoveryError.
func (c Discovery) WithDefaults() (Discovery, error) {
	var errs []error
	if c.Namespace == "" {
		errs = append(errs, fieldErr("namespace", "required"))
	} else if msg := checkDNS1123Label(c.Namespace); msg != "" {
		errs = append(errs, fieldErr("namespace", "%q: %s", c.Namespace, msg))
	}
	switch {
	case c.InferencePool != "" && c.Service != "":
		errs = append(errs, fieldErr("inference_pool", "excludes service"))
	case c.InferencePool != "":
		if msg := checkDNS1123Subdomain(c.InferencePool); msg != "" {
			errs = append(errs, fieldErr("inference_pool", "%q: %s", c.InferencePool, msg))
		}
	case c.Service == "" && c.Selector == "":
		errs = append(errs, fieldErr("service", "service, selector or inference_pool is required"))
	}
	if c.Service != "" {
		if msg := checkDNS1035Label(c.Service); msg != "" {
			errs = append(errs, fieldErr("service", "%q: %s", c.Service, msg))
		}
	}
	if c.Selector != "" {
		if err := checkSelector(c.Selector); err != nil {
			errs = append(errs, fieldErr("selector", "%q: %v", c.Selector, err))
		}
	}
	if c.Service == "" {
		c.PodAnnotations = true
	}
	if c.Port != "" {
		if n, err := strconv.Atoi(c.Port); err == nil {
			if n < 1 || n > 65535 {
				errs = append(errs, fieldErr("port", "%d out of range", n))
			}
		} else if msg := checkPortName(c.Port); msg != "" {
			errs = append(errs, fieldErr("port", "%q: %s", c.Port, msg))
		}
	}
	if c.Resync == 0 {
		c.Resync = 5 * time.Minute
	} else if c.Resync < 0 {
		errs = append(errs, fieldErr("resync", "%s is negative", c.Resync))
	}
	if c.SecretRefresh == 0 {
		c.SecretRefresh = time.Minute
	} else if c.SecretRefresh < 0 {
		errs = append(errs, fieldErr("secret_refresh", "%s is negative", c.SecretRefresh))
	}
	if c.Defaults.DPSize == 0 {
		c.Defaults.DPSize = 1
	}
	for _, e := range c.Defaults.Check() {
		e.Field = "defaults." + e.Field
		errs = append(errs, e)
	}
	if c.Defaults.ReplayPort != 0 && c.Defaults.EventsPort == 0 {
		// As for router.yaml's engines; a Pod's annotation may still turn
		// its events off (events-port "0") and leave the default replay.
		errs = append(errs, fieldErr("defaults.replay_port", "%d needs events_port", c.Defaults.ReplayPort))
	}
	switch c.RoleLabel {
	case "":
		c.RoleLabel = DefaultRoleLabel
	case RoleLabelOff:
	default:
		if msg := checkLabelKey(c.RoleLabel); msg != "" {
			errs = append(errs, fieldErr("role_label", "%q: %s", c.RoleLabel, msg))
		}
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

// Check reports settings no engine can have, each naming its field.
func (s EngineSettings) Check() []*DiscoveryError {
	var errs []*DiscoveryError
	add := func(field, format string, a ...any) {
		errs = append(errs, &DiscoveryError{Field: field, Msg: fmt.Sprintf(format, a...)})
	}
	for _, p := range []struct {
		name string
		v    int
	}{{"events_port", s.EventsPort}, {"replay_port", s.ReplayPort}} {
		if p.v < 0 || p.v > 65535 {
			add(p.name, "%d out of range", p.v)
		}
	}
	if s.DPSize < 1 || s.DPSize > MaxDPSize {
		add("dp_size", "%d: want 1..%d", s.DPSize, MaxDPSize)
	}
	if s.EventsPort != 0 && s.EventsPort+s.DPSize-1 > 65535 {
		add("events_port", "%d + dp_size %d passes 65535", s.EventsPort, s.DPSize)
	}
	if s.ReplayPort != 0 && s.ReplayPort+s.DPSize-1 > 65535 {
		add("replay_port", "%d + dp_size %d passes 65535", s.ReplayPort, s.DPSize)
	}
	if s.EventsPort != 0 && s.ReplayPort != 0 && s.EventsPort < s.ReplayPort+s.DPSize && s.ReplayPort < s.EventsPort+s.DPSize {
		add("replay_port", "events ports %d+%d overlap replay ports %d+%d", s.EventsPort, s.DPSize, s.ReplayPort, s.DPSize)
	}
	if (s.APIKeySecret.Name == "") != (s.APIKeySecret.Key == "") {
		add("api_key_secret", "needs both name and key, got %q/%q", s.APIKeySecret.Name, s.APIKeySecret.Key)
	}
	return errs
}

// Validate reports every problem of c at once, as discovery.New would (nil: fine).
func (c Discovery) Validate() error {
	_, err := c.WithDefaults()
	return err
}

// DefaultRoleLabel is Discovery.RoleLabel's default: llm-d's P/D role label
// (llm-d/llm-d-inference-scheduler pkg/plugins/filter/pd_role.go:
// RoleLabel "llm-d.ai/role", values prefill, decode, prefill-decode and
// the older both; its decode filter also takes Pods without the label).
const DefaultRoleLabel = "llm-d.ai/role"

// RoleLabelOff as Discovery.RoleLabel turns roles off: every engine serves
// whole requests.
const RoleLabelOff = "-"
