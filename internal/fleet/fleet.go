package fleet

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"kvrouter/internal/vllm/enginemetrics"
)

// ErrNoEndpoint means no endpoint of the requested model may receive traffic
// now: none is configured, or all are down.
var ErrNoEndpoint = errors.New("no healthy endpoint")

// EndpointConfig is one engine as configured.
type EndpointConfig struct {
	// Name labels the endpoint in metrics, logs and the x-kvrouter-replica
	// header. Default: the URL's host:port.
	Name string
	// URL is the engine's HTTP base URL, e.g. "http://10.0.0.1:8000"
	// (without the /v1 suffix).
	URL string
	// Models are the model names the engine serves (its served-model-name and
	// LoRA adapters). At least one.
	Models []string
	// APIKey, when set, is sent to the engine as "Authorization: Bearer ...".
	APIKey string
}

// Config configures a Fleet. A zero field means the default in its comment,
// filled in by DefaultConfig.
type Config struct {
	// Models are model names that exist even while no endpoint serves
	// them (a group whose engines come from discovery); Healthy answers
	// ErrNoEndpoint for them until one is added.
	Models []string
	// Endpoints are the endpoints at start; Add and Remove change them.
	Endpoints []EndpointConfig
	// ProbeInterval is the period of GET /health probes per endpoint (default
	// 5s; negative disables probes: down endpoints return after their backoff).
	ProbeInterval time.Duration
	// ProbeTimeout bounds one probe or scrape (default 2s).
	ProbeTimeout time.Duration
	// ScrapeInterval is the period of GET /metrics scrapes per endpoint
	// (default 1s; negative disables scraping).
	ScrapeInterval time.Duration
	// EjectAfterServerErrors is how many 5xx answers (other than 503) in a
	// row take an endpoint down (default 3).
	EjectAfterServerErrors int
	// EjectAfterBackpressure is how many 429/503 answers in a row take an
	// endpoint down (default 10): an isolated one is backpressure, not death.
	EjectAfterBackpressure int
	// EjectAfterProbeTimeouts is how many /health probes in a row that get
	// no answer within ProbeTimeout take an endpoint down (default 2): one
	// slow answer from a starved host is not death. A definite failure
	// (connection refused, a status other than 200) takes it down at once.
	EjectAfterProbeTimeouts int
	// PanicThreshold is the share of a model's endpoints, in [0, 1], that
	// must be up (default 0.5; negative: never). Below it the model is in
	// panic mode: Healthy also returns its endpoints that are down for
	// timeouts alone (probe or request timeouts, which a starved but live
	// engine produces), so the router spreads requests over them by load
	// instead of answering "no healthy endpoint". Endpoints down for a
	// definite failure (connection refused, /health answering non-200, a
	// TLS verification failure, runs of 5xx or 429/503) stay out.
	PanicThreshold float64
	// ModelsInterval is the period of GET /v1/models per endpoint, which
	// checks that the engine serves its configured model names and learns
	// each model's max_model_len (default 30s; negative disables).
	ModelsInterval time.Duration
	// TLS configures the default Client's connections to https endpoints
	// (its RootCAs verify them); nil: the system's roots. Ignored when
	// Client is set.
	TLS *tls.Config
	// BackoffBase is how long an endpoint stays down after its first
	// ejection (default 1s); it doubles per ejection without a healthy probe
	// in between, up to BackoffMax (default 30s).
	BackoffBase, BackoffMax time.Duration
	// StallAfter is the least time a request waits for its first body byte
	// before it is overdue; a request predicted to take longer (Await's
	// ttft) is overdue after 2 x its prediction. An engine with an overdue
	// request that shows no sign of life since it was sent, for StallAfter
	// and at least 1.5 ScrapeInterval, is held out of routing as stalled
	// until its next sign of life. Signs of life are body bytes of any
	// request, scrapes whose vLLM work counters moved (or, with nothing
	// waiting, that report no work), and, for an engine without those
	// counters, any answered scrape, and probes answered while nothing
	// waits (stall.go). Default 1s; negative: off.
	StallAfter time.Duration
	// OnMetrics, if not nil, receives each successful scrape of an
	// endpoint's /metrics (load gauges, block size, number of GPU blocks).
	// It is called from Run's goroutines and must not block.
	OnMetrics func(ep *Endpoint, m enginemetrics.Metrics)
	// OnRestart, if not nil, is called when a scrape finds a monotonic
	// vllm: counter (prefix_cache_queries_total, prefix_cache_hits_total,
	// num_preemptions_total) lower than at the previous scrape: the engine
	// process restarted, its prefix cache is empty. This catches a restart
	// that keeps the KV event connection (an idle engine sends no event that
	// would reveal it). Called from Run's goroutines before OnMetrics; must
	// not block.
	OnRestart func(ep *Endpoint)
	// Client sends probes, scrapes and model listings (default: a client
	// with its own transport).
	Client *http.Client
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// DefaultConfig returns the defaults of every Config field.
func DefaultConfig() Config {
	return Config{
		ProbeInterval:           5 * time.Second,
		ProbeTimeout:            2 * time.Second,
		ScrapeInterval:          time.Second,
		EjectAfterServerErrors:  3,
		EjectAfterBackpressure:  10,
		EjectAfterProbeTimeouts: 2,
		PanicThreshold:          0.5,
		ModelsInterval:          30 * time.Second,
		BackoffBase:             time.Second,
		BackoffMax:              30 * time.Second,
		StallAfter:              time.Second,
		Now:                     time.Now,
	}
}

func (c *Config) fillDefaults() {
	d := DefaultConfig()
	if c.ProbeInterval == 0 {
		c.ProbeInterval = d.ProbeInterval
	}
	if c.ProbeTimeout == 0 {
		c.ProbeTimeout = d.ProbeTimeout
	}
	if c.ScrapeInterval == 0 {
		c.ScrapeInterval = d.ScrapeInterval
	}
	if c.StallAfter == 0 {
		c.StallAfter = d.StallAfter
	}
	if c.EjectAfterServerErrors == 0 {
		c.EjectAfterServerErrors = d.EjectAfterServerErrors
	}
	if c.EjectAfterBackpressure == 0 {
		c.EjectAfterBackpressure = d.EjectAfterBackpressure
	}
	if c.EjectAfterProbeTimeouts == 0 {
		c.EjectAfterProbeTimeouts = d.EjectAfterProbeTimeouts
	}
	if c.PanicThreshold == 0 {
		c.PanicThreshold = d.PanicThreshold
	}
	if c.ModelsInterval == 0 {
		c.ModelsInterval = d.ModelsInterval
	}
	if c.BackoffBase == 0 {
		c.BackoffBase = d.BackoffBase
	}
	if c.BackoffMax == 0 {
		c.BackoffMax = d.BackoffMax
	}
	if c.Now == nil {
		c.Now = d.Now
	}
	if c.Client == nil {
		c.Client = &http.Client{Transport: &http.Transport{
			TLSClientConfig:     c.TLS,
			MaxIdleConnsPerHost: 4,
			IdleConnTimeout:     90 * time.Second,
		}}
	}
}

// Fleet is the set of endpoints. It is safe for concurrent use: readers
// see an immutable view, replaced whole by Add and Remove.
type Fleet struct {
	cfg Config
	log *slog.Logger
	m   *metrics

	mu      sync.Mutex // serializes Add and Remove
	v       atomic.Pointer[view]
	changed chan struct{} // capacity 1: Run re-reads the view
}

// New checks cfg and builds a Fleet; it starts no goroutines (see Run). All
// configuration problems are returned at once. A nil log discards; reg may
// be nil.
func New(cfg Config, log *slog.Logger, reg prometheus.Registerer) (*Fleet, error) {
	cfg.fillDefaults()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var errs []error
	if len(cfg.Endpoints) == 0 && len(cfg.Models) == 0 {
		errs = append(errs, errors.New("no endpoints"))
	}
	if cfg.BackoffMax < cfg.BackoffBase {
		errs = append(errs, fmt.Errorf("backoff max %v < base %v", cfg.BackoffMax, cfg.BackoffBase))
	}
	if cfg.PanicThreshold > 1 || cfg.PanicThreshold != cfg.PanicThreshold {
		errs = append(errs, fmt.Errorf("panic threshold %v: want a share in [0, 1] (negative: off)", cfg.PanicThreshold))
	}
	f := &Fleet{cfg: cfg, log: log, changed: make(chan struct{}, 1)}
	v := &view{byModel: map[string]*members{}}
	for _, m := range cfg.Models {
		v.member(m)
	}
	names := map[string]bool{}
	for i, ec := range cfg.Endpoints {
		ep, err := f.newEndpoint(ec)
		if err != nil {
			errs = append(errs, fmt.Errorf("endpoints[%d]: %w", i, err))
			continue
		}
		if names[ep.name] {
			errs = append(errs, fmt.Errorf("endpoints[%d]: duplicate name %q", i, ep.name))
			continue
		}
		names[ep.name] = true
		v = v.with(ep)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	f.m = m
	for _, ep := range v.all {
		f.m.initEndpoint(ep)
	}
	for m := range v.byModel {
		f.m.panic.WithLabelValues(m).Set(0)
	}
	f.v.Store(v)
	return f, nil
}

// newEndpoint checks ec and makes its endpoint (up, admitted).
func (f *Fleet) newEndpoint(ec EndpointConfig) (*Endpoint, error) {
	u, err := url.Parse(ec.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("url %q: want http(s)://host:port", ec.URL)
	}
	if len(ec.Models) == 0 {
		return nil, fmt.Errorf("%s: no models", ec.URL)
	}
	name := ec.Name
	if name == "" {
		name = u.Host
	}
	ep := &Endpoint{
		name:    name,
		base:    strings.TrimRight(ec.URL, "/"),
		models:  slices.Clone(ec.Models),
		backoff: f.cfg.BackoffBase,
		probed:  f.cfg.ProbeInterval < 0,
	}
	ep.SetAPIKey(ec.APIKey)
	return ep, nil
}

// Models returns the model names (configured, or served by an endpoint
// added since), sorted.
func (f *Fleet) Models() []string {
	v := f.view()
	out := make([]string, 0, len(v.byModel))
	for m := range v.byModel {
		out = append(out, m)
	}
	slices.Sort(out)
	return out
}

// Endpoints returns every endpoint of model, up or down, admitted or not,
// in the order they were configured or added; nil for an unknown model. The
// slice is shared: do not modify it.
func (f *Fleet) Endpoints(model string) []*Endpoint {
	if g := f.view().byModel[model]; g != nil {
		return g.eps
	}
	return nil
}

// All returns every endpoint in the order they were configured or added.
// The slice is shared: do not modify it.
func (f *Fleet) All() []*Endpoint { return f.view().all }

// Endpoint returns the endpoint with that name, or nil (also once it was
// removed).
func (f *Fleet) Endpoint(name string) *Endpoint {
	for _, ep := range f.view().all {
		if ep.name == name {
			return ep
		}
	}
	return nil
}
