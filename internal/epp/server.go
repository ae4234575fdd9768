package epp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime/debug"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/net/netutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	"kvrouter/internal/bodybudget"
	"kvrouter/internal/frontmetrics"
	"kvrouter/internal/pick"
)

// picker is what a stream asks of the routing core.
type picker interface {
	// Pick parses, tokenizes and routes a request; the error is the
	// answer to give instead.
	Pick(ctx context.Context, in pick.Input) (*pick.Pick, *pick.Error)
	// EndpointNamed is an engine for a request that is no inference
	// request (no lease).
	EndpointNamed(allow func(addr string) bool) (name, addr string, ok bool)
	// TooLarge is the answer to a body over BodyLimit bytes.
	TooLarge() *pick.Error
	// BodyLimit is the most bytes of one request body; Bodies bounds
	// all bodies the process holds at once (shared with the HTTP front).
	BodyLimit() int64
	Bodies() *bodybudget.Budget
	// AllowDPRank reports router.yaml's clients.allow_dp_rank;
	// CountClientControl counts a client control dropped or refused
	// (kvrouter_proxy_client_controls_total).
	AllowDPRank() bool
	CountClientControl(control string)
	HasReplica(replica string) bool
}

// Picker is the routing core the EPP asks: the HTTP front's own
// (admission.Picker, from proxy.Server.Picker), so that both fronts parse, tokenize and route
// alike.
type Picker interface {
	picker
	// FrontMetrics is the request metrics set the HTTP front registered;
	// the EPP takes its front="epp" view.
	FrontMetrics() *frontmetrics.Set
	// OnReplicaRemoved registers f, called with the name of each engine
	// removed from the pool.
	OnReplicaRemoved(f func(replica string))
}

// Deps are a Server's collaborators.
type Deps struct {
	// Picker routes requests (proxy.Server.Picker()). Required. Its
	// FrontMetrics are the request series the EPP exports with
	// front="epp", beside the HTTP front's.
	Picker Picker
	// Models are the configured model names, and Replicas the engines
	// known at start, for their metric series (created at 0).
	Models   []string
	Replicas []string
	// Ready reports readiness: the engines' source has synced and the KV
	// event subscribers are connected. Nil: always ready.
	Ready func() bool
}

// Server is the ext_proc endpoint picker and its health service. Safe for
// concurrent use.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer
	cfg   Config
	pick  picker
	ready func() bool
	log   *slog.Logger
	m     *metrics
	holds *frontmetrics.Holds // streams writing each engine's series (replicas.go)
	// bodies bounds the request bodies the process holds (body.go).
	bodies *bodybudget.Budget
}

// New builds a Server from cfg (defaults filled here). It starts nothing.
func New(cfg Config, deps Deps, log *slog.Logger, reg prometheus.Registerer) (*Server, error) {
	cfg.FillDefaults()
	var errs []error
	if err := cfg.Validate(); err != nil {
		errs = append(errs, err)
	}
	if deps.Picker == nil {
		errs = append(errs, errors.New("epp: no picker"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	s, err := newServer(cfg, deps.Picker, deps.Picker.FrontMetrics(), deps, log, reg)
	if err != nil {
		return nil, err
	}
	deps.Picker.OnReplicaRemoved(s.replicaRemoved)
	return s, nil
}

// newServer builds a Server on p, exporting the shared request series
// through fs (front="epp") and its own on reg.
func newServer(cfg Config, p picker, fs *frontmetrics.Set, deps Deps, log *slog.Logger, reg prometheus.Registerer) (*Server, error) {
	ready := deps.Ready
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if ready == nil {
		ready = func() bool { return true }
	}
	m, err := newMetrics(reg, fs)
	if err != nil {
		return nil, fmt.Errorf("epp: metrics: %w", err)
	}
	for _, name := range deps.Models {
		m.initModel(name)
	}
	m.InFlight.WithLabelValues("") // the front's series exists before the first pick
	for _, r := range deps.Replicas {
		m.InFlight.WithLabelValues(r)
	}
	m.Requests.WithLabelValues("unknown", "", outcomeBadRequest)
	m.Requests.WithLabelValues("", "", outcomePassthrough)
	return &Server{cfg: cfg, pick: p, ready: ready, log: log, m: m, holds: frontmetrics.NewHolds(m.Front, p.HasReplica),
		bodies: p.Bodies()}, nil
}

// Register adds the ext_proc and health services to g.
func (s *Server) Register(g *grpc.Server) {
	extprocv3.RegisterExternalProcessorServer(g, s)
	healthpb.RegisterHealthServer(g, &health{ready: s.ready})
}

// Process serves one ext_proc stream: one HTTP request through the
// gateway. A panic in it ends the stream with an Internal status (and the
// request's lease) instead of the process.
func (s *Server) Process(stream extprocv3.ExternalProcessor_ProcessServer) (err error) {
	st := &exchange{s: s, stream: stream, body: assembler{limit: s.pick.BodyLimit(), budget: s.bodies, gauge: s.m.bodyHeld}}
	s.m.streams.Inc()
	defer s.m.streams.Dec()
	defer func() {
		if r := recover(); r != nil {
			s.log.Error("ext_proc stream panicked", "panic", r, "stack", string(debug.Stack()))
			err = status.Errorf(codes.Internal, "endpoint picker failed: %v", r)
		}
		st.close()
		st.body.release()
		s.holds.Release(&st.held) // after close: the request is counted
	}()
	return st.run()
}

// Run serves on ln until ctx ends, then stops gracefully: streams in
// flight get Config.DrainTimeout to end before they are cut. At most
// Config.MaxConnections connections are open at once. It returns
// nil after a stop, or the listener's error.
func (s *Server) Run(ctx context.Context, ln net.Listener) error {
	g := grpc.NewServer(grpc.ConnectionTimeout(s.cfg.HandshakeTimeout),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: s.cfg.IdleTimeout}))
	s.Register(g)
	if s.cfg.MaxConnections > 0 {
		ln = netutil.LimitListener(ln, s.cfg.MaxConnections)
	}
	errc := make(chan error, 1)
	go func() { errc <- g.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("epp: serve: %w", err)
	case <-ctx.Done():
	}
	done := make(chan struct{})
	go func() { g.GracefulStop(); close(done) }()
	t := time.NewTimer(s.cfg.DrainTimeout)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		s.log.Warn("epp: drain deadline passed, cutting streams")
		g.Stop()
		<-done
	}
	<-errc
	return nil
}
