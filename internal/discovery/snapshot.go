package discovery

import (
	"cmp"
	"errors"
	"net"
	"slices"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"kvrouter/internal/config"
)

// State is what an engine may be sent.
type State uint8

// States, worst first.
const (
	// StateNotReady: listed but gets nothing new (not ready and not
	// terminating, or terminating and no longer serving). It may come
	// back; its index entries are worth keeping.
	StateNotReady State = iota
	// StateDraining: terminating and still serving; finishes what it has
	// and gets nothing new.
	StateDraining
	// StateReady: gets new requests.
	StateReady
)

// String returns "not_ready", "draining" or "ready" (a metric label).
func (s State) String() string {
	switch s {
	case StateReady:
		return "ready"
	case StateDraining:
		return "draining"
	}
	return "not_ready"
}

// Engine is one engine of a snapshot. Addr is its identity: a Pod that
// comes back on another IP is another engine.
type Engine struct {
	// Name is the engine's Pod name, or Addr when its endpoint names no Pod.
	Name string
	// Addr is the HTTP API's host:port, "10.1.2.3:8000" or "[fd00::3]:8000".
	Addr string
	// State is what it may be sent.
	State State
	// Settings are config.Discovery.Defaults overlaid with the Pod's annotations.
	Settings config.EngineSettings
	// APIKey is the engine's API key, read from the Secret key
	// config.EngineSettings.APIKeySecret names ("" when it names none).
	APIKey string
	// Role is config.RolePrefill or config.RoleDecode from the Pod's config.Discovery.RoleLabel
	// (role.go); "" with roles off or without the Pod (a Service source
	// without PodAnnotations).
	Role string
}

// Host is Addr's IP (or name), the host of the KV event and replay ports.
func (e Engine) Host() string {
	h, _, _ := net.SplitHostPort(e.Addr)
	return h
}

// Snapshot is the complete desired set of engines at one moment.
type Snapshot struct {
	// Engines has one entry per Addr, sorted by Addr. An engine absent
	// from it is gone.
	Engines []Engine
}

// builder turns cached objects into engines. Its hooks report, for the
// Source to log once and count, what it skipped and which annotations it
// could not use, and (at Debug) endpoints waiting for their Pod.
type builder struct {
	cfg     config.Discovery
	skip    func(object, reason string)
	bad     func(pod, key, value string, err error)
	pending func(addr, pod string)
}

// endpointState maps EndpointSlice conditions (nil ready and serving mean
// true, nil terminating false; discovery/v1 types.go). Terminating wins
// over ready, which publishNotReadyAddresses can set on a terminating
// endpoint.
func endpointState(c discoveryv1.EndpointConditions) State {
	isTrue := func(b *bool, def bool) bool {
		if b == nil {
			return def
		}
		return *b
	}
	switch {
	case isTrue(c.Terminating, false):
		if isTrue(c.Serving, true) {
			return StateDraining
		}
		return StateNotReady
	case isTrue(c.Ready, true):
		return StateReady
	}
	return StateNotReady
}

// slicePort picks the engines' port in a slice; ok false means skip it.
func (b *builder) slicePort(s *discoveryv1.EndpointSlice) (int, bool) {
	name := "endpointslice " + s.Namespace + "/" + s.Name
	want, numeric := strconv.Atoi(b.cfg.Port)
	switch {
	case b.cfg.Port == "":
		if len(s.Ports) != 1 || s.Ports[0].Port == nil {
			b.skip(name, "it does not list exactly one port and no port is configured")
			return 0, false
		}
		return int(*s.Ports[0].Port), true
	default:
		for _, p := range s.Ports {
			if p.Port == nil {
				continue
			}
			if (numeric == nil && int(*p.Port) == want) || (p.Name != nil && *p.Name == b.cfg.Port) {
				return int(*p.Port), true
			}
		}
		b.skip(name, "it has no port "+b.cfg.Port)
		return 0, false
	}
}

// fromSlices lists the engines of a Service's EndpointSlices. pod looks
// up a Pod's annotations by name; nil means config.Discovery.Defaults for every
// engine, and an endpoint whose Pod it does not find is left out until
// the Pod informer has it.
func (b *builder) fromSlices(slices []*discoveryv1.EndpointSlice, pod func(name string) (*corev1.Pod, bool)) []Engine {
	var out []Engine
	for _, s := range slices {
		port, ok := b.slicePort(s)
		if !ok {
			continue
		}
		for _, ep := range s.Endpoints {
			if len(ep.Addresses) == 0 {
				continue
			}
			// The addresses of one endpoint are fungible; consumers may use
			// only the first (discovery/v1 types.go).
			addr := net.JoinHostPort(ep.Addresses[0], strconv.Itoa(port))
			e := Engine{Name: addr, Addr: addr, State: endpointState(ep.Conditions), Settings: b.cfg.Defaults}
			if ep.TargetRef != nil && ep.TargetRef.Kind == "Pod" && ep.TargetRef.Name != "" {
				e.Name = ep.TargetRef.Name
				if pod != nil {
					p, ok := pod(ep.TargetRef.Name)
					if !ok {
						b.pending(addr, ep.TargetRef.Name)
						continue
					}
					e.Settings, e.Role = b.settings(p), b.role(p)
				}
			}
			out = append(out, e)
		}
	}
	return dedup(out)
}

// fromPods lists the engines of Pods (a label selector's).
func (b *builder) fromPods(pods []*corev1.Pod) []Engine {
	var out []Engine
	for _, p := range pods {
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed || p.Status.PodIP == "" {
			continue
		}
		port, ok := b.podPort(p)
		if !ok {
			continue
		}
		out = append(out, Engine{
			Name:     p.Name,
			Addr:     net.JoinHostPort(p.Status.PodIP, strconv.Itoa(port)),
			State:    podState(p),
			Settings: b.settings(p),
			Role:     b.role(p),
		})
	}
	return dedup(out)
}

// podState: the Ready condition stands for serving, a deletion timestamp
// for terminating.
func podState(p *corev1.Pod) State {
	ready := false
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			ready = c.Status == corev1.ConditionTrue
		}
	}
	switch {
	case p.DeletionTimestamp != nil && ready:
		return StateDraining
	case p.DeletionTimestamp == nil && ready:
		return StateReady
	}
	return StateNotReady
}

// podPort picks a Pod's HTTP port (config.Discovery.Port).
func (b *builder) podPort(p *corev1.Pod) (int, bool) {
	if n, err := strconv.Atoi(b.cfg.Port); err == nil {
		return n, true
	}
	for _, c := range p.Spec.Containers {
		for _, cp := range c.Ports {
			if cp.Protocol != "" && cp.Protocol != corev1.ProtocolTCP {
				continue
			}
			if b.cfg.Port == "" || cp.Name == b.cfg.Port {
				return int(cp.ContainerPort), true
			}
		}
	}
	if b.cfg.Port == "" {
		return defaultPort, true
	}
	b.skip("pod "+p.Namespace+"/"+p.Name, "it has no container port named "+b.cfg.Port)
	return 0, false
}

// settings overlays a Pod's annotations on the defaults.
func (b *builder) settings(p *corev1.Pod) config.EngineSettings {
	return settingsFrom(p.Annotations, b.cfg.Defaults, func(key, value string, err error) {
		b.bad(p.Namespace+"/"+p.Name, key, value, err)
	})
}

// role is p's engine role (role.go); a label value it does not know is
// reported like a bad annotation.
func (b *builder) role(p *corev1.Pod) string {
	label := b.cfg.RoleLabel
	if label == config.RoleLabelOff {
		label = ""
	}
	return role(p.Labels, label, func(v string) {
		b.bad(p.Namespace+"/"+p.Name, label, v, errors.New("want prefill, decode, prefill-decode or both (taken as decode)"))
	})
}

// dedup sorts by Addr and keeps, for an Addr listed more than once, its
// best state (then the first listed).
func dedup(es []Engine) []Engine {
	slices.SortStableFunc(es, func(a, b Engine) int {
		return cmp.Or(cmp.Compare(a.Addr, b.Addr), cmp.Compare(b.State, a.State))
	})
	return slices.CompactFunc(es, func(a, b Engine) bool { return a.Addr == b.Addr })
}
