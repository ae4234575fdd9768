package epp

import (
	"errors"
	"fmt"
	"time"
)

// Metadata namespaces and keys of the Endpoint Picker Protocol
// (docs/proposals/004-endpoint-picker-protocol).
const (
	// DestinationNamespace is the default namespace of the pick in the
	// response's dynamic metadata and of the served endpoint in the
	// response's metadata_context.
	DestinationNamespace = "envoy.lb"
	// SubsetNamespace is the default namespace of the subset hint in the
	// request's metadata_context.
	SubsetNamespace = "envoy.lb.subset_hint"
	// DestinationKey is the pick's header and metadata key.
	DestinationKey = "x-gateway-destination-endpoint"
	// SubsetKey is the subset hint's key: a list of "ip:port".
	SubsetKey = "x-gateway-destination-endpoint-subset"
	// ServedKey is the served endpoint's key: "ip:port".
	ServedKey = "x-gateway-destination-endpoint-served"
)

// Health service names of the protocol's Health Checking section.
const (
	HealthLiveness    = "liveness"
	HealthReadiness   = "readiness"
	HealthExtProc     = "envoy.service.ext_proc.v3.ExternalProcessor"
	healthPollTimeout = time.Second
)

// Config configures the EPP. A zero field means the default in its comment.
type Config struct {
	// Listen is the gRPC listen address (default ":9002", the port the
	// upstream EPP and the InferencePool's endpointPickerRef examples use).
	Listen string `yaml:"listen"`
	// MaxInFlight, when positive, is the most requests one endpoint may
	// have open through the EPP; a request whose every candidate is at it
	// is answered 429 (the protocol's shed answer). Default 0: no limit.
	MaxInFlight int64 `yaml:"max_in_flight"`
	// DestinationNamespace and SubsetNamespace override the metadata
	// namespaces (defaults "envoy.lb" and "envoy.lb.subset_hint").
	DestinationNamespace string `yaml:"destination_namespace"`
	SubsetNamespace      string `yaml:"subset_namespace"`
	// DrainTimeout bounds a graceful stop: streams in flight get this long
	// to end (default 30s).
	DrainTimeout time.Duration `yaml:"drain_timeout"`
	// HandshakeTimeout bounds a new connection's HTTP/2 handshake (default
	// 10s; grpc.ConnectionTimeout): a client that connects and sends
	// nothing is closed after it.
	HandshakeTimeout time.Duration `yaml:"handshake_timeout"`
	// IdleTimeout closes a connection without a stream for this long
	// (default 5m; keepalive.ServerParameters.MaxConnectionIdle, with a
	// GOAWAY the gateway reconnects after).
	IdleTimeout time.Duration `yaml:"idle_timeout"`
	// MaxConnections bounds the gRPC connections open at once (default
	// 1024; negative: no bound). Past it a new connection waits in the
	// listen backlog until one closes (netutil.LimitListener). A gateway
	// opens a few per worker thread.
	MaxConnections int `yaml:"max_connections"`
}

// FillDefaults fills zero fields.
func (c *Config) FillDefaults() {
	if c.Listen == "" {
		c.Listen = ":9002"
	}
	if c.DestinationNamespace == "" {
		c.DestinationNamespace = DestinationNamespace
	}
	if c.SubsetNamespace == "" {
		c.SubsetNamespace = SubsetNamespace
	}
	if c.DrainTimeout == 0 {
		c.DrainTimeout = 30 * time.Second
	}
	if c.HandshakeTimeout == 0 {
		c.HandshakeTimeout = 10 * time.Second
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = 5 * time.Minute
	}
	if c.MaxConnections == 0 {
		c.MaxConnections = 1024
	}
}

// Validate reports every problem at once (nil: fine).
func (c Config) Validate() error {
	var errs []error
	if c.MaxInFlight < 0 {
		errs = append(errs, fmt.Errorf("epp: max_in_flight %d is negative", c.MaxInFlight))
	}
	if c.DrainTimeout < 0 {
		errs = append(errs, fmt.Errorf("epp: drain_timeout %s is negative", c.DrainTimeout))
	}
	if c.HandshakeTimeout < 0 {
		errs = append(errs, fmt.Errorf("epp: handshake_timeout %s is negative", c.HandshakeTimeout))
	}
	if c.IdleTimeout < 0 {
		errs = append(errs, fmt.Errorf("epp: idle_timeout %s is negative", c.IdleTimeout))
	}
	return errors.Join(errs...)
}
