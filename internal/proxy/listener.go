package proxy

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"kvrouter/internal/config"
)

// Limits of the router's own listeners (docs/security.md, "HTTP
// listener"). An idle or slow client holds a connection, and with it a file
// descriptor, only for a bounded time, and the number of open connections
// is capped below the process's file limit, so that the router keeps its
// descriptors for engines, event sockets, snapshots and its probes' answers.
//
// Past max_connections a connection is still accepted into a small
// reserve, where it may ask GET /health or GET /ready once (the
// connection is closed after the answer); any other request there gets a
// 503 with Retry-After. With the reserve full, a new connection takes the
// place of the reserve's oldest one whose request has not arrived (that
// one is closed), or is closed as soon as it is accepted when every
// reserved connection has sent its request. A probe sends its request at
// once, so silent connections opened at any rate cannot keep it out:
// Kubernetes probes keep their answers while clients are refused, and the
// kernel's accept queue never fills.

// reservedHeaderTimeout bounds, from accept, the wait for a reserved
// connection's request headers (or header_timeout when shorter): a probe
// sends its request at once, so a silent client holds a reserved slot for
// a second, not for header_timeout.
const reservedHeaderTimeout = time.Second

// Listener names, the label of the connection series.
const (
	listenerMain  = "main"
	listenerAdmin = "admin"
)

// connLimit counts one listener's open connections (http.Server's
// ConnContext and ConnState hooks) and decides, per accepted connection,
// whether it is served, reserved (probes only) or closed. Safe for
// concurrent use.
type connLimit struct {
	max, reserve int64
	// headerWait: reserved connections' header timeout.
	headerWait time.Duration
	open       atomic.Int64
	gauge      prometheus.Gauge
	rejected   *prometheus.CounterVec // by reason
	// mu guards waiting, the timers of reserved connections whose request
	// has not arrived, and order, those connections oldest first (with
	// ones since gone, skipped when met).
	mu      sync.Mutex
	waiting map[net.Conn]*time.Timer
	order   []net.Conn
}

// connSlotKey marks, in a connection's context, a connection accepted into
// the reserve; its value is the connection.
type connSlotKey struct{}

// connContext counts a new connection; one past the cap and the reserve
// is closed at once (the server then reports it closed, which uncounts it).
func (l *connLimit) connContext(ctx context.Context, c net.Conn) context.Context {
	n := l.open.Add(1)
	l.gauge.Set(float64(l.open.Load())) // read again: see connState
	if n <= l.max {
		return ctx
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if n > l.max+l.reserve {
		l.rejected.WithLabelValues("max_connections").Inc() // c, or the one it displaces
		if !l.displaceOldest() {
			_ = c.Close()
			return ctx
		}
	}
	// Closed unless its request's headers arrive within headerWait (the
	// guard stops the timer).
	if l.waiting == nil {
		l.waiting = map[net.Conn]*time.Timer{}
	}
	l.waiting[c] = time.AfterFunc(l.headerWait, func() {
		if l.arrived(c) {
			_ = c.Close()
		}
	})
	if len(l.order) >= 2*len(l.waiting)+16 { // drop the gone, keep order bounded
		l.order = slices.DeleteFunc(l.order, func(o net.Conn) bool { return l.waiting[o] == nil })
	}
	l.order = append(l.order, c)
	return context.WithValue(ctx, connSlotKey{}, c)
}

// displaceOldest closes the oldest reserved connection whose request has
// not arrived; false when there is none. l.mu is held.
func (l *connLimit) displaceOldest() bool {
	for len(l.order) > 0 {
		c := l.order[0]
		l.order = l.order[1:]
		if t, ok := l.waiting[c]; ok {
			delete(l.waiting, c)
			t.Stop()
			_ = c.Close()
			return true
		}
	}
	return false
}

// connState uncounts a connection that closed or was taken over.
func (l *connLimit) connState(c net.Conn, st http.ConnState) {
	if st == http.StateClosed || st == http.StateHijacked {
		l.arrived(c)
		l.open.Add(-1)
		// The count read at Set, not Add's result: two closes racing could
		// otherwise leave the gauge at the older count for good.
		l.gauge.Set(float64(l.open.Load()))
	}
}

// arrived stops the header timer of reserved connection c; false when it
// has fired (the connection is closing).
func (l *connLimit) arrived(c net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	t, ok := l.waiting[c]
	if ok {
		delete(l.waiting, c)
		t.Stop()
	}
	return ok
}

// guard serves requests of reserved connections: GET (or HEAD) /health
// and /ready, then the connection closes; anything else is a 503.
func (l *connLimit) guard(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, _ := r.Context().Value(connSlotKey{}).(net.Conn)
		if c == nil {
			h.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Connection", "close")
		if !l.arrived(c) {
			return // closed by its header timer
		}
		if (r.Method == http.MethodGet || r.Method == http.MethodHead) && (r.URL.Path == "/health" || r.URL.Path == "/ready") {
			h.ServeHTTP(w, r)
			return
		}
		l.rejected.WithLabelValues("reserved").Inc()
		(&apiError{status: http.StatusServiceUnavailable, typ: typeServiceUnavailable, retryAfter: time.Second,
			message: fmt.Sprintf("too many open connections (http.max_connections %d): retry later", l.max)}).write(w)
	})
}

// listenerMetrics are the listeners' collectors.
type listenerMetrics struct {
	conns    *prometheus.GaugeVec
	rejected *prometheus.CounterVec
	bodies   prometheus.Gauge
	bodyRej  *prometheus.CounterVec
	clients  *prometheus.CounterVec
}

func newListenerMetrics(reg prometheus.Registerer) (*listenerMetrics, error) {
	m := &listenerMetrics{
		conns: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kvrouter_proxy_connections",
			Help: "Open client connections, by listener (main, admin).",
		}, []string{"listener"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_proxy_connections_rejected_total",
			Help: "Client connections or requests refused for http.max_connections, by listener and reason (max_connections: past the reserve, a silent reserved connection closed to make room or the new one closed at accept; reserved: a request other than /health or /ready on a reserved connection).",
		}, []string{"listener", "reason"}),
		bodies: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvrouter_proxy_body_held_bytes",
			Help: "Bytes of request bodies held at once (bounded by body_budget).",
		}),
		bodyRej: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_proxy_body_rejected_total",
			Help: "Request bodies refused, by reason (budget: 503, body_budget full; too_large: 413, over body_limit; idle: 408, body_idle_timeout; timeout: 408, body_timeout).",
		}, []string{"reason"}),
		clients: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_proxy_client_controls_total",
			Help: "Engine controls a client sent without clients.allow_* (dp_rank: header dropped; kv_transfer_params: request refused 400).",
		}, []string{"control"}),
	}
	for _, l := range []string{listenerMain, listenerAdmin} {
		m.conns.WithLabelValues(l)
		for _, r := range []string{"max_connections", "reserved"} {
			m.rejected.WithLabelValues(l, r)
		}
	}
	for _, r := range []string{"budget", "too_large", "idle", "timeout"} {
		m.bodyRej.WithLabelValues(r)
	}
	for _, c := range []string{"dp_rank", "kv_transfer_params"} {
		m.clients.WithLabelValues(c)
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.conns, m.rejected, m.bodies, m.bodyRej, m.clients} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Run serves the main listener on ln until ctx is done, then stops
// accepting, lets requests in flight finish for up to config.Config.DrainTimeout,
// closes what is left and returns. It returns nil after a drain, or the
// listener's error.
func (s *Server) Run(ctx context.Context, ln net.Listener) error {
	return s.serve(ctx, ln, listenerMain, s.handler)
}

// RunAdmin serves the admin listener (config.Config.AdminListen: /metrics, /ui,
// /v1/route, /health, /ready) on ln until ctx is done, as Run does.
func (s *Server) RunAdmin(ctx context.Context, ln net.Listener) error {
	return s.serve(ctx, ln, listenerAdmin, s.admin)
}

func (s *Server) serve(ctx context.Context, ln net.Listener, name string, h http.Handler) error {
	lc := s.cfg.HTTP
	lim := &connLimit{max: int64(lc.MaxConnections), reserve: int64(max(lc.ReservedConnections, 0)),
		gauge: s.lm.conns.WithLabelValues(name), rejected: s.lm.rejected.MustCurryWith(prometheus.Labels{"listener": name})}
	if lim.max <= 0 {
		lim.max = int64(config.Default().HTTP.MaxConnections)
	}
	headerTimeout := orDefault(lc.HeaderTimeout, config.Default().HTTP.HeaderTimeout)
	lim.headerWait = min(headerTimeout, reservedHeaderTimeout)
	srv := &http.Server{
		Handler:           closeUnread(lim.guard(h)),
		ReadHeaderTimeout: headerTimeout,
		IdleTimeout:       orDefault(lc.IdleTimeout, config.Default().HTTP.IdleTimeout),
		MaxHeaderBytes:    cmp.Or(max(lc.MaxHeaderBytes, 0), config.Default().HTTP.MaxHeaderBytes),
		ErrorLog:          slog.NewLogLogger(s.log.With("listener", name).Handler(), slog.LevelWarn),
		BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
		ConnContext:       lim.connContext,
		ConnState:         lim.connState,
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		s.closeIdle()
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	s.log.Info("draining", "listener", name, "timeout", s.cfg.DrainTimeout)
	dctx, cancel := context.WithTimeout(context.Background(), s.cfg.DrainTimeout)
	defer cancel()
	err := srv.Shutdown(dctx)
	if err != nil {
		s.log.Warn("drain deadline passed, closing connections", "listener", name, "err", err)
		_ = srv.Close()
	}
	<-errc
	s.closeIdle()
	return nil
}

// orDefault returns d when v is not positive.
func orDefault(v, d time.Duration) time.Duration {
	if v <= 0 {
		return d
	}
	return v
}
