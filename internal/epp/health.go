package epp

import (
	"context"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// health is the gRPC Health Checking service with the protocol's three
// service names (docs/proposals/004-endpoint-picker-protocol, Health
// Checking): "liveness" serves while the process answers; "readiness" and
// the ExternalProcessor's name serve when ready() does. "" (the server as
// a whole) is liveness. No leader election: replicas of kvrouter's EPP
// each hold their own index from the engines' events, so every replica is
// ready on its own (active-active).
type health struct {
	healthpb.UnimplementedHealthServer
	ready func() bool
}

func (h *health) status(service string) (healthpb.HealthCheckResponse_ServingStatus, bool) {
	switch service {
	case "", HealthLiveness:
		return healthpb.HealthCheckResponse_SERVING, true
	case HealthReadiness, HealthExtProc:
		if h.ready() {
			return healthpb.HealthCheckResponse_SERVING, true
		}
		return healthpb.HealthCheckResponse_NOT_SERVING, true
	}
	return healthpb.HealthCheckResponse_SERVICE_UNKNOWN, false
}

// Check answers one check; an unknown service is NotFound, as the gRPC
// health protocol asks.
func (h *health) Check(_ context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	st, ok := h.status(req.GetService())
	if !ok {
		return nil, status.Errorf(codes.NotFound, "unknown service %q", req.GetService())
	}
	return &healthpb.HealthCheckResponse{Status: st}, nil
}

// Watch sends the status at once and then on every change (checked each
// second) until the client leaves.
func (h *health) Watch(req *healthpb.HealthCheckRequest, w healthpb.Health_WatchServer) error {
	last := healthpb.HealthCheckResponse_ServingStatus(-1)
	t := time.NewTicker(healthPollTimeout)
	defer t.Stop()
	for {
		st, _ := h.status(req.GetService())
		if st != last {
			if err := w.Send(&healthpb.HealthCheckResponse{Status: st}); err != nil {
				return err
			}
			last = st
		}
		select {
		case <-w.Context().Done():
			return nil
		case <-t.C:
		}
	}
}

// List answers every service's status.
func (h *health) List(context.Context, *healthpb.HealthListRequest) (*healthpb.HealthListResponse, error) {
	out := &healthpb.HealthListResponse{Statuses: map[string]*healthpb.HealthCheckResponse{}}
	for _, name := range []string{"", HealthLiveness, HealthReadiness, HealthExtProc} {
		st, _ := h.status(name)
		out.Statuses[name] = &healthpb.HealthCheckResponse{Status: st}
	}
	return out, nil
}
