package config

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"kvrouter/internal/kvindex"
	"kvrouter/internal/pd"
	"kvrouter/internal/routing"
	"kvrouter/internal/vllm"
)

// Config is the router's configuration: the schema of router.yaml. A zero
// field means the default in its comment, filled in by DefaultConfig and
// FillDefaults.
type Config struct {
	// Listen is the HTTP listen address (default ":8080").
	Listen string `yaml:"listen"`
	// APIKey, when set, is required from clients as "Authorization: Bearer
	// ..." on /v1/*. The environment variable KVROUTER_API_KEY overrides it.
	APIKey string `yaml:"api_key"`
	// AdminListen, when set, is a second listen address serving the
	// introspection paths (/metrics, /ui, /v1/route) beside /health and
	// /ready; the main listener then no longer serves them (docs/security.md).
	// Empty: they are served on Listen, behind APIKey when it is set.
	AdminListen string `yaml:"admin_listen"`
	// BodyLimit is the largest request body accepted, in bytes (default 16
	// MiB, DefaultBodyLimit); larger bodies are answered 413.
	BodyLimit int64 `yaml:"body_limit"`
	// BodyBudget bounds the bytes of request bodies held at once by all
	// requests together (default 512 MiB, or BodyLimit when larger); a body
	// that does not fit is answered 503 with Retry-After.
	BodyBudget int64 `yaml:"body_budget"`
	// HTTP bounds the connections of the listeners (docs/security.md).
	HTTP Listener `yaml:"http"`
	// Clients says which engine controls clients may set themselves
	// (docs/security.md); by default none.
	Clients Clients `yaml:"clients"`
	// DrainTimeout bounds graceful shutdown: after the listener closes,
	// requests in flight get this long to finish (default 30s).
	DrainTimeout time.Duration `yaml:"drain_timeout"`
	// Health configures active probes, scraping and passive ejection of
	// engines (package fleet).
	Health Health `yaml:"health"`
	// TLS configures HTTPS on Listen and the verification of https://
	// engines.
	TLS TLS `yaml:"tls"`
	// Snapshot writes the exact index to a file on shutdown and
	// periodically, and reads it on start (by serve).
	Snapshot Snapshot `yaml:"snapshot"`
	// Peers, when set, gives every model group's router its place among
	// the router replicas (routing.Config.Routers and RouterIndex) from
	// the Ready router Pods in Kubernetes, live (discovery.Peers; pod_name
	// and namespace default to POD_NAME and POD_NAMESPACE). Nil: the
	// static routing.routers and router_index.
	Peers *Peers `yaml:"peers"`
	// EventsMaxMessageBytes bounds one ZeroMQ message read from any
	// engine's KV event, replay or bound events port
	// (kvevents.SubscriberConfig.MaxMessageBytes: 4096..2^40; 0: default
	// 128 MiB); a peer that exceeds it has its connection closed.
	EventsMaxMessageBytes int64 `yaml:"events_max_message_bytes"`
	// Models are the model groups served; at least one.
	Models []Model `yaml:"models"`
}

// HealthConfig mirrors fleet.Config's health fields; zero means fleet's
// default.
type Health struct {
	// ProbeInterval between GET /health probes per engine (default 5s;
	// negative disables probes).
	ProbeInterval time.Duration `yaml:"probe_interval"`
	// ProbeTimeout bounds a probe, a scrape or a model listing (default 2s).
	ProbeTimeout time.Duration `yaml:"probe_timeout"`
	// ScrapeInterval between GET /metrics scrapes per engine (default 1s;
	// negative disables scraping).
	ScrapeInterval time.Duration `yaml:"scrape_interval"`
	// EjectAfterServerErrors: 5xx answers in a row that eject (default 3).
	EjectAfterServerErrors int `yaml:"eject_after_server_errors"`
	// EjectAfterBackpressure: 429/503 answers in a row that eject (default 10).
	EjectAfterBackpressure int `yaml:"eject_after_backpressure"`
	// BackoffBase and BackoffMax bound how long an ejected engine stays out
	// (default 1s doubling to 30s).
	BackoffBase time.Duration `yaml:"backoff_base"`
	BackoffMax  time.Duration `yaml:"backoff_max"`
	// EjectAfterProbeTimeouts: probes in a row without an answer within
	// probe_timeout that eject (default 2; a refused connection or a
	// non-200 answer ejects at once).
	EjectAfterProbeTimeouts int `yaml:"eject_after_probe_timeouts"`
	// PanicThreshold is the share of a model's engines, in [0, 1], that
	// must be up (default 0.5; negative: off); below it engines ejected for
	// timeouts alone are routed too (fleet.Config.PanicThreshold).
	PanicThreshold float64 `yaml:"panic_threshold"`
	// ModelsInterval between GET /v1/models checks per engine (default
	// 30s; negative disables): an engine that does not list its model's
	// name is not ready.
	ModelsInterval time.Duration `yaml:"models_interval"`
	// StallAfter is how long a request may wait for its first body byte
	// (or 2 x its predicted time to first token, if longer) while its
	// engine shows no progress (no byte on any request, no scrape whose
	// vLLM work counters moved, for at least 1.5 scrape_interval) before
	// the engine takes no new requests, until it shows progress again
	// (fleet.Config.StallAfter; default 1s, negative: off).
	StallAfter time.Duration `yaml:"stall_after"`
}

// TLSConfig holds certificate files in PEM.
type TLS struct {
	// CertFile and KeyFile, both or neither, make the router serve HTTPS
	// on Listen with that certificate (chain first) and private key.
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// EngineCAFile holds the CA certificates that verify https:// engines
	// (and their render endpoints) instead of the system's roots; empty:
	// the system's roots.
	EngineCAFile string `yaml:"engine_ca_file"`
}

// Model is one model group: the engines that serve it and how to
// route among them.
type Model struct {
	// Name is the model name clients send (the engines' served model name).
	Name string `yaml:"name"`
	// Engines are the replicas; at least one.
	Engines []Engine `yaml:"engines"`
	// Discovery takes the group's engines from Kubernetes instead of
	// Engines: a Service's EndpointSlices or Pods by label selector, with
	// per-engine settings from Pod annotations (docs/kubernetes.md).
	// Engines come and go while the router serves; exactly one of Engines
	// and Discovery is set.
	Discovery *Discovery `yaml:"discovery"`
	// Tokenizer is how prompts become token ids: a path to a tokenizer.json
	// (or its directory), "render" to ask an engine (POST
	// /v1/*/render), or "none" (token-id prompts only; text is routed by
	// load). Default "render".
	Tokenizer string `yaml:"tokenizer"`
	// TokenizerPrefixCacheBytes bounds the local tokenizer's cache of
	// rendered chat prefixes (tokenizer.PrefixCache: a conversation's next
	// turn encodes only its new text and hashes only its new blocks), in
	// bytes of token ids and block keys held; 0
	// means 64 MiB, -1 turns the cache off. Unused without a local
	// tokenizer.
	TokenizerPrefixCacheBytes int64 `yaml:"tokenizer_prefix_cache_bytes"`
	// Policy is the routing policy: kv (default), round_robin, random,
	// least_load, session, prefix_chars, ..., or shadow (serve with
	// ShadowServe, compute and export what kv would have done).
	Policy string `yaml:"policy"`
	// ShadowServe is the policy that serves traffic in shadow mode
	// (default round_robin).
	ShadowServe string `yaml:"shadow_serve"`
	// Routing configures the router: rates, the kv policy's weights, the
	// peers' policies (see routing.Config; its policy and block_size fields
	// are ignored: Policy above and the learned block size rule).
	Routing routing.Config `yaml:"routing"`
	// Index configures the block index (see kvindex.Config; model and
	// block_size are ignored: the model name and the learned block size).
	Index kvindex.Config `yaml:"index"`
	// TokenizerMismatch is the reaction when the local tokenizer disagrees
	// with the engine's /tokenize at start-up or later: render (default:
	// ask the engine while they disagree), refuse (fail start-up) or
	// continue (log and count).
	TokenizerMismatch string `yaml:"tokenizer_mismatch"`
	// SessionHeaders are request headers whose first non-empty value is
	// the session key for the session policy and ties (default
	// [x-session-id]).
	SessionHeaders []string `yaml:"session_headers"`
	// Retries is how many other replicas to try after a retryable failure
	// before the first byte (default 1; -1 for none).
	Retries int `yaml:"retries"`
	// Timeouts of each engine request.
	Timeouts Timeouts `yaml:"timeouts"`
	// DisableHitReport stops merging vllm_xargs.kv_cache_report_mode =
	// "full" into forwarded requests (for engines older than 2026-07 that
	// reject unknown xargs).
	DisableHitReport bool `yaml:"disable_hit_report"`
	// TooLong is what happens to a request whose prompt tokens plus
	// requested output tokens exceed the engines' max_model_len (read
	// from their /v1/models): "reject" (default: answer vLLM's own 400
	// without forwarding) or "forward" (let the engine answer).
	TooLong string `yaml:"too_long"`
	// Adapters are LoRA adapters the group's engines serve on top of this
	// model; adapters the engines list with this model as
	// parent are served too, without configuration.
	Adapters []Adapter `yaml:"adapters"`
	// AdapterLoading is what happens to a request for an adapter no healthy
	// engine has loaded: "off" (default: 503) or "load" (load it, when it
	// has a path, on the engine the router picks).
	AdapterLoading string `yaml:"adapter_loading"`
	// Aliases are further client-facing model names over this group, each
	// with request defaults and caps.
	Aliases []Alias `yaml:"aliases"`
	// Media bounds the images, audio and video of one chat request
	// (nil: none).
	Media *MediaLimits `yaml:"media"`
	// PD configures disaggregated prefill and decode for a group whose
	// engines have roles (docs/pd.md): mode (conditional, always,
	// never), min_remote_tokens, link, link_gbps and the model's KV shape.
	PD pd.Rule `yaml:"pd"`
}

// TimeoutsConfig bounds one engine request.
type Timeouts struct {
	// Connect bounds the TCP (and TLS) connect (default 5s).
	Connect time.Duration `yaml:"connect"`
	// FirstByte bounds the wait from sending the request to the first body
	// byte (default 5m). vLLM sends a non-streaming answer whole, so for
	// those this bounds the whole generation.
	FirstByte time.Duration `yaml:"first_byte"`
	// Idle bounds the wait between two body chunks (default 60s).
	Idle time.Duration `yaml:"idle"`
}

// Engine is one engine (replica).
type Engine struct {
	// Name labels the engine in metrics, logs and x-kvrouter-replica
	// (default: the URL's host:port).
	Name string `yaml:"name"`
	// URL is the engine's HTTP base URL, e.g. http://10.0.0.1:8000.
	URL string `yaml:"url"`
	// Events is the engine's KV event PUB endpoint, e.g. tcp://10.0.0.1:5557
	// (vLLM --kv-events-config endpoint); empty: no events. A model with no
	// engine on events uses the approximate index; one with some engines on
	// events uses the event-fed index, which never sees an engine without
	// (serve warns at start; /ready does not count it).
	Events string `yaml:"events"`
	// EventsBind makes kvrouter bind Events and the engine dial in (vLLM
	// connects when its --kv-events-config endpoint names a host): Events
	// is then the local address to bind, tcp://127.0.0.1:P (keeps the
	// stream on loopback), tcp://*:P or ipc:///path, and the engine's
	// endpoint is that address with kvrouter's host. Replay is still
	// dialled. One address per engine.
	EventsBind bool `yaml:"events_bind"`
	// Topic is the SUB prefix filter, the engine's --kv-events-config
	// "topic" (default "": every topic).
	Topic string `yaml:"topic"`
	// Replay is the engine's replay ROUTER endpoint, e.g.
	// tcp://10.0.0.1:5600 (apart from the events ports: rank r binds both
	// at port+r; checked); empty: gaps cannot be replayed.
	Replay string `yaml:"replay"`
	// DPSize is the engine's data-parallel size: rank r publishes on the
	// events and replay ports + r (default 1).
	DPSize int `yaml:"dp_size"`
	// IdleCheck is how long a rank may send no KV events before kvrouter
	// asks its replay endpoint for batches dropped at the end of a burst
	// (kvevents.SubscriberConfig.IdleCheck; default 5s, negative: off).
	IdleCheck time.Duration `yaml:"idle_check"`
	// EventsQueue is how many decoded KV event batches of this engine may
	// wait for the index (kvevents.SubscriberConfig.QueueSize: 1..1048576,
	// default 1024). Batches that find it full are fetched again from the
	// replay endpoint once it has drained; the engine rank's blocks are
	// dropped only when the engine no longer buffers them (or there is no
	// replay endpoint).
	EventsQueue int `yaml:"events_queue"`
	// APIKey is sent to the engine as a bearer token.
	APIKey string `yaml:"api_key"`
	// APIKeyEnv names an environment variable holding the key; it
	// overrides APIKey (keeps secrets out of the file). A variable that is
	// unset or empty is a configuration error (Validate), not a silent
	// start without the key.
	APIKeyEnv string `yaml:"api_key_env"`
	// Role is the engine's part in disaggregated serving: prefill or
	// decode (docs/pd.md); empty: it serves whole requests. A group with roles
	// needs both; its engines without a role are not routed to.
	Role string `yaml:"role"`

	// apiKeyEnvUnset is set by FillDefaults when APIKeyEnv names an unset
	// or empty variable.
	apiKeyEnvUnset bool
}

// Tokenizer modes besides a path.
const (
	TokenizerRender = "render"
	TokenizerNone   = "none"
)

// Model.TooLong values.
const (
	TooLongReject  = "reject"
	TooLongForward = "forward"
)

// PolicyShadow is the policy name of shadow mode (group.PolicyShadow:
// route by the shadow's serve policy, record what kv would have done).
const PolicyShadow = "shadow"

// Default returns the top-level defaults (no models).
func Default() Config {
	return Config{
		Listen:       ":8080",
		BodyLimit:    DefaultBodyLimit,
		BodyBudget:   512 << 20,
		DrainTimeout: 30 * time.Second,
		HTTP:         defaultListener(),
	}
}

// defaultModel returns a model's defaults.
func defaultModel() Model {
	return Model{
		Tokenizer:         TokenizerRender,
		TokenizerMismatch: "render",
		Policy:            "kv",
		ShadowServe:       "round_robin",
		TooLong:           TooLongReject,
		SessionHeaders:    []string{"x-session-id"},
		Retries:           1,
		Timeouts: Timeouts{
			Connect:   5 * time.Second,
			FirstByte: 5 * time.Minute,
			Idle:      60 * time.Second,
		},
	}
}

// FillDefaults replaces zero fields with defaults and applies environment
// overrides (getenv is os.Getenv when nil).
func (c *Config) FillDefaults(getenv func(string) string) {
	if getenv == nil {
		getenv = os.Getenv
	}
	d := Default()
	if c.Listen == "" {
		c.Listen = d.Listen
	}
	if c.BodyLimit == 0 {
		c.BodyLimit = d.BodyLimit
	}
	if c.BodyBudget == 0 {
		c.BodyBudget = max(d.BodyBudget, c.BodyLimit)
	}
	c.HTTP.fillDefaults(d.HTTP)
	if c.DrainTimeout == 0 {
		c.DrainTimeout = d.DrainTimeout
	}
	c.Snapshot.fillDefaults()
	c.fillPeers(getenv)
	if k := getenv("KVROUTER_API_KEY"); k != "" {
		c.APIKey = k
	}
	dm := defaultModel()
	for i := range c.Models {
		m := &c.Models[i]
		if m.Tokenizer == "" {
			m.Tokenizer = dm.Tokenizer
		}
		if m.Policy == "" {
			m.Policy = dm.Policy
		}
		if m.ShadowServe == "" {
			m.ShadowServe = dm.ShadowServe
		}
		if m.TokenizerMismatch == "" {
			m.TokenizerMismatch = dm.TokenizerMismatch
		}
		if m.AdapterLoading == "" {
			m.AdapterLoading = AdapterLoadingOff
		}
		if m.TooLong == "" {
			m.TooLong = dm.TooLong
		}
		if len(m.SessionHeaders) == 0 {
			m.SessionHeaders = dm.SessionHeaders
		}
		switch m.Retries {
		case 0:
			m.Retries = dm.Retries
		case -1:
			m.Retries = 0
		} // other negatives are left for Validate to reject
		if m.Timeouts.Connect == 0 {
			m.Timeouts.Connect = dm.Timeouts.Connect
		}
		if m.Timeouts.FirstByte == 0 {
			m.Timeouts.FirstByte = dm.Timeouts.FirstByte
		}
		if m.Timeouts.Idle == 0 {
			m.Timeouts.Idle = dm.Timeouts.Idle
		}
		for j := range m.Engines {
			e := &m.Engines[j]
			if e.DPSize == 0 {
				e.DPSize = 1
			}
			if e.EventsQueue == 0 {
				e.EventsQueue = vllm.DefaultQueueSize
			}
			if e.APIKeyEnv != "" {
				k := getenv(e.APIKeyEnv)
				e.apiKeyEnvUnset = k == ""
				if k != "" {
					e.APIKey = k
				}
			}
		}
	}
}

// fieldError is a validation error naming the field by its YAML path.
type fieldError struct {
	path []any // field names (string) and indexes (int)
	msg  string
}

func (e *fieldError) Error() string { return FieldPath(e.path...) + ": " + e.msg }

// FieldPath names a field by its YAML path, names and indexes: ("models",
// 0, "engines", 1, "url") is "models[0].engines[1].url". Other values are
// skipped.
func FieldPath(path ...any) string {
	var b strings.Builder
	for _, p := range path {
		switch p := p.(type) {
		case int:
			fmt.Fprintf(&b, "[%d]", p)
		case string:
			if b.Len() > 0 {
				b.WriteByte('.')
			}
			b.WriteString(p)
		}
	}
	return b.String()
}

func ferr(msg string, path ...any) error { return &fieldError{path: path, msg: msg} }

// discoveryErrors names each problem of models[i].discovery by its
// sub-field ("models[0].discovery.defaults.dp_size: ...").
func discoveryErrors(err error, i int) []error {
	if err == nil {
		return nil
	}
	list := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		list = j.Unwrap()
	}
	out := make([]error, 0, len(list))
	for _, e := range list {
		path := []any{"models", i, "discovery"}
		var fe *DiscoveryError
		if !errors.As(e, &fe) {
			out = append(out, ferr(e.Error(), path...))
			continue
		}
		for _, f := range strings.Split(fe.Field, ".") {
			path = append(path, f)
		}
		out = append(out, ferr(fe.Msg, path...))
	}
	return out
}

// Validate returns every problem of a defaults-filled Config at once, each
// naming its field (e.g. "models[0].engines[1].url: ...").
func (c *Config) Validate() error {
	var errs []error
	if c.BodyLimit < 0 {
		errs = append(errs, ferr("must be positive", "body_limit"))
	}
	if n := c.EventsMaxMessageBytes; n != 0 && (n < vllm.MinMaxMessageBytes || n > vllm.MaxMaxMessageBytes) {
		errs = append(errs, ferr(fmt.Sprintf("%d: must be in %d..%d (0: default %d)", n, vllm.MinMaxMessageBytes, int64(vllm.MaxMaxMessageBytes), vllm.DefaultMaxMessageBytes), "events_max_message_bytes"))
	}
	if c.BodyBudget < 0 {
		errs = append(errs, ferr("must be positive", "body_budget"))
	} else if c.BodyBudget > 0 && c.BodyBudget < c.BodyLimit {
		errs = append(errs, ferr(fmt.Sprintf("%d is less than body_limit %d: a body of the largest size could never be read", c.BodyBudget, c.BodyLimit), "body_budget"))
	}
	errs = append(errs, c.HTTP.validate()...)
	if len(c.Models) == 0 {
		errs = append(errs, ferr("at least one model is required", "models"))
	}
	models := map[string]bool{}
	engines := map[string]string{}
	var binds bindSet
	for i, m := range c.Models {
		if m.Name == "" {
			errs = append(errs, ferr("required", "models", i, "name"))
		} else if models[m.Name] {
			errs = append(errs, ferr(fmt.Sprintf("duplicate model %q", m.Name), "models", i, "name"))
		}
		models[m.Name] = true
		switch {
		case m.Discovery != nil && len(m.Engines) > 0:
			errs = append(errs, ferr("engines and discovery exclude each other", "models", i, "discovery"))
		case m.Discovery != nil:
			errs = append(errs, discoveryErrors(m.Discovery.Validate(), i)...)
		case len(m.Engines) == 0:
			errs = append(errs, ferr("at least one engine (or discovery) is required", "models", i, "engines"))
		}
		if m.Policy != PolicyShadow && !slices.Contains(routing.Policies(), m.Policy) {
			errs = append(errs, ferr(fmt.Sprintf("unknown policy %q (known: shadow, %s)", m.Policy, strings.Join(routing.Policies(), ", ")), "models", i, "policy"))
		}
		if !slices.Contains(routing.Policies(), m.ShadowServe) {
			errs = append(errs, ferr(fmt.Sprintf("unknown policy %q", m.ShadowServe), "models", i, "shadow_serve"))
		}
		switch m.TokenizerMismatch {
		case "render", "refuse", "continue":
		default:
			errs = append(errs, ferr(fmt.Sprintf("%q: want render, refuse or continue", m.TokenizerMismatch), "models", i, "tokenizer_mismatch"))
		}
		if m.TooLong != TooLongReject && m.TooLong != TooLongForward {
			errs = append(errs, ferr(fmt.Sprintf("%q: want reject or forward", m.TooLong), "models", i, "too_long"))
		}
		for _, h := range m.SessionHeaders {
			if h == "" {
				errs = append(errs, ferr("empty header name", "models", i, "session_headers"))
			}
		}
		errs = append(errs, validatePD(m, i)...)
		for j, e := range m.Engines {
			key := e.Name
			if key == "" {
				key = e.URL
			}
			if prev, ok := engines[key]; ok {
				errs = append(errs, ferr(fmt.Sprintf("engine %q already listed (%s): an engine belongs to one model group", key, prev), "models", i, "engines", j))
			}
			engines[key] = FieldPath("models", i, "engines", j)
			u, err := url.Parse(e.URL)
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				errs = append(errs, ferr(fmt.Sprintf("%q: want http(s)://host:port", e.URL), "models", i, "engines", j, "url"))
			}
			for _, f := range []struct {
				name, v string
				bind    bool
			}{{"events", e.Events, e.EventsBind}, {"replay", e.Replay, false}} {
				if f.v == "" {
					continue
				}
				if msg := checkZMQEndpoint(f.v, e.DPSize, f.bind); msg != "" {
					errs = append(errs, ferr(msg, "models", i, "engines", j, f.name))
				}
			}
			if e.EventsBind {
				if e.Events == "" {
					errs = append(errs, ferr("events_bind without events (the address to bind)", "models", i, "engines", j, "events_bind"))
				} else if prev := binds.add(e.Events, e.DPSize, FieldPath("models", i, "engines", j, "events")); prev != "" {
					errs = append(errs, ferr(fmt.Sprintf("%q: address already bound for %s (one address per engine)", e.Events, prev), "models", i, "engines", j, "events"))
				}
			}
			if e.Replay != "" && e.Events == "" {
				errs = append(errs, ferr("replay without events", "models", i, "engines", j, "replay"))
			}
			if msg := portsOverlap(e.Events, e.Replay, e.DPSize); msg != "" {
				errs = append(errs, ferr(msg, "models", i, "engines", j, "replay"))
			}
			if e.DPSize < 1 {
				errs = append(errs, ferr("must be >= 1", "models", i, "engines", j, "dp_size"))
			}
			if e.apiKeyEnvUnset {
				errs = append(errs, ferr(fmt.Sprintf("environment variable %s is not set (or empty): the engine's key would be missing", e.APIKeyEnv), "models", i, "engines", j, "api_key_env"))
			}
			if e.EventsQueue < 1 || e.EventsQueue > vllm.MaxQueueSize {
				errs = append(errs, ferr(fmt.Sprintf("%d: must be in 1..%d (0: default %d)", e.EventsQueue, vllm.MaxQueueSize, vllm.DefaultQueueSize), "models", i, "engines", j, "events_queue"))
			}
		}
	}
	for i := range c.Models {
		errs = append(errs, validateAdapters(&c.Models[i], i, models)...)
		errs = append(errs, validateAliases(&c.Models[i], i, models)...)
		errs = append(errs, validateMedia(c.Models[i].Media, "models", i, "media")...)
		for j := range c.Models[i].Aliases {
			errs = append(errs, validateMedia(c.Models[i].Aliases[j].Media, "models", i, "aliases", j, "media")...)
		}
	}
	errs = append(errs, c.validateNumbers()...)
	errs = append(errs, c.validatePeers()...)
	return errors.Join(errs...)
}
