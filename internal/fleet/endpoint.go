package fleet

import (
	"sync"
	"sync/atomic"
	"time"

	"kvrouter/internal/vllm/enginemetrics"
)

// Outcome classes one forwarded request's result, as the proxy saw it, for
// passive health checking.
type Outcome uint8

// Outcomes reported to Fleet.Report.
const (
	// OutcomeOK is any answer that says the engine works: 2xx, 3xx, and 4xx
	// other than 429 (a bad request is the client's fault).
	OutcomeOK Outcome = iota
	// OutcomeConnError is a failure to connect, or a connection broken before
	// or during the response. It takes the endpoint down at once.
	OutcomeConnError
	// OutcomeServerError is a 5xx answer other than 503.
	OutcomeServerError
	// OutcomeBackpressure is a 429 or 503 answer: the engine is busy.
	OutcomeBackpressure
	// OutcomeTimeout is a request that got no answer in time before any
	// byte came back (the connect or TLS handshake timed out). It takes the
	// endpoint down at once, but only for timeouts: in panic mode (see
	// Config.PanicThreshold) the endpoint is still routed.
	OutcomeTimeout
)

// String returns a lower-case name used as a metric label.
func (o Outcome) String() string {
	switch o {
	case OutcomeOK:
		return "ok"
	case OutcomeConnError:
		return "conn_error"
	case OutcomeServerError:
		return "server_error"
	case OutcomeBackpressure:
		return "backpressure"
	case OutcomeTimeout:
		return "timeout"
	}
	return "unknown"
}

// OutcomeOf classes an HTTP status code.
func OutcomeOf(status int) Outcome {
	switch {
	case status == 429 || status == 503:
		return OutcomeBackpressure
	case status >= 500:
		return OutcomeServerError
	}
	return OutcomeOK
}

// OutcomeOfError classes a failed request (one that got no HTTP answer):
// OutcomeTimeout when err is a timeout (context.DeadlineExceeded or a
// net.Error whose Timeout is true), else OutcomeConnError.
func OutcomeOfError(err error) Outcome {
	if isTimeout(err) {
		return OutcomeTimeout
	}
	return OutcomeConnError
}

// Endpoint is one engine. Its identity is immutable; its health state is
// guarded by a mutex. Safe for concurrent use.
type Endpoint struct {
	name   string
	base   string
	models []string
	// apiKey is the bearer token sent to the engine; it may change
	// (SetAPIKey, a rotated Secret) while the endpoint lives.
	apiKey atomic.Pointer[string]

	inFlight atomic.Int64
	// notAdmitted: the endpoint's source keeps it from new requests
	// (Fleet.SetRoutable).
	notAdmitted atomic.Bool
	// removed (under metricsMu): Fleet.Remove took it out; its metric
	// series are gone and must not come back.
	metricsMu sync.Mutex
	removed   bool

	mu         sync.Mutex
	down       bool
	downUntil  time.Time
	backoff    time.Duration
	serverErrs int
	backpress  int
	probed     bool // a probe has succeeded (or probes are off)
	// soft: down, and its last failure was a timeout (no answer), not a
	// definite one; such an endpoint is routed in panic mode.
	soft bool
	// probeTimeouts counts probes in a row that timed out.
	probeTimeouts int
	// missing holds the configured models the last /v1/models listing
	// lacked, and notedServed the served ids last logged about.
	missing     map[string]bool
	notedServed string

	// listing is the last successful /v1/models listing; nil before.
	listing atomic.Pointer[listing]
	// counters are the monotonic vllm: counters of the last scrape that
	// had them (see restartedLocked); nil before.
	counters map[string]float64

	// stall is the stall detector's state (stall.go).
	stall stallState

	// lora is the vllm:lora_requests_info of the last scrape that had it
	// (loraslots.go); nil before.
	lora atomic.Pointer[enginemetrics.LoRAInfo]
}

// Name is the endpoint's label (metrics, logs, x-kvrouter-replica).
func (e *Endpoint) Name() string { return e.name }

// URL is the engine's base URL without a trailing slash.
func (e *Endpoint) URL() string { return e.base }

// Models are the configured model names. Do not modify the slice.
func (e *Endpoint) Models() []string { return e.models }

// APIKey is the bearer token to send to the engine, or "".
func (e *Endpoint) APIKey() string {
	if k := e.apiKey.Load(); k != nil {
		return *k
	}
	return ""
}

// SetAPIKey replaces the bearer token sent to the engine from the next
// request or probe on (a rotated key); requests in flight keep theirs.
func (e *Endpoint) SetAPIKey(key string) { e.apiKey.Store(&key) }

// Admitted reports whether the endpoint's source lets it take new
// requests (Fleet.SetRoutable; true unless set otherwise).
func (e *Endpoint) Admitted() bool { return !e.notAdmitted.Load() }

// InFlight is the number of requests the proxy has open on the endpoint.
func (e *Endpoint) InFlight() int64 { return e.inFlight.Load() }

// AddInFlight adds d (+1 at the start of a request, -1 at its end) and
// returns the new count.
func (e *Endpoint) AddInFlight(d int64) int64 { return e.inFlight.Add(d) }

// usable reports whether the endpoint may take traffic at now (not
// ejected, not stalled), whether,
// if not, it is down for timeouts only (soft), and when it may be
// re-admitted. Without probes (noProbe), a down endpoint comes back once
// its backoff has passed.
func (e *Endpoint) usable(now time.Time, noProbe bool) (up, soft bool, until time.Time) {
	if e.stall.stalled.Load() {
		return false, true, now // back at its next sign of life (stall.go)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.down {
		return true, false, time.Time{}
	}
	if noProbe && !now.Before(e.downUntil) {
		e.down, e.soft = false, false
		return true, false, time.Time{}
	}
	return false, e.soft, e.downUntil
}

// Up reports whether the endpoint is up (not ejected), as of the last
// report or probe.
func (e *Endpoint) Up() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return !e.down
}

func (e *Endpoint) wasProbed() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.probed
}

// ejectLocked takes the endpoint down until now+backoff and doubles the
// backoff; soft says the failure was a timeout. It reports whether the
// endpoint was up before. On an endpoint already down it only records the
// latest failure's class.
func (e *Endpoint) ejectLocked(now time.Time, max time.Duration, soft bool) bool {
	e.soft = soft
	if e.down {
		return false
	}
	was := !e.down
	e.down = true
	e.downUntil = now.Add(e.backoff)
	e.backoff = min(2*e.backoff, max)
	e.serverErrs, e.backpress = 0, 0
	return was
}
