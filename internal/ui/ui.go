package ui

import (
	"crypto/subtle"
	_ "embed"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"kvrouter/internal/fleet"
	"kvrouter/internal/vllm/enginemetrics"
)

//go:embed page.html
var page []byte

// Recent is how many decisions the page lists.
const Recent = 50

// Config configures a UI.
type Config struct {
	// APIKey, when set, is required on /ui and /ui/state.
	APIKey string
	// Policies names each model's routing policy (model -> policy).
	Policies map[string]string
}

// Deps are a UI's sources.
type Deps struct {
	// Fleet holds the engines. Required.
	Fleet *fleet.Fleet
	// Gatherer is the router's registry (kvrouter_* metrics); nil: none.
	Gatherer prometheus.Gatherer
	// Now is the clock (time.Now).
	Now func() time.Time
}

// UI is the live fleet page. Safe for concurrent use.
type UI struct {
	cfg  Config
	deps Deps

	mu      sync.Mutex
	engines map[string]engineSample // by endpoint name
	recent  []recorded              // ring of the last Recent
	next    int
}

type engineSample struct {
	m  enginemetrics.Metrics
	at time.Time
}

// Decision is one routing decision as the page lists it.
type Decision struct {
	Time         time.Time       `json:"time"`
	Model        string          `json:"model"`
	RequestID    string          `json:"request_id"`
	Replica      string          `json:"replica"`
	CachedTokens int             `json:"cached_tokens"`
	PromptTokens int             `json:"prompt_tokens"`
	Explain      json.RawMessage `json:"explain,omitempty"`
}

// recorded is a decision as Record keeps it: explain is marshalled only
// when the page asks (the proxy builds a fresh record per decision and
// does not touch it afterwards).
type recorded struct {
	d       Decision
	explain any
}

// New returns a UI over deps.
func New(cfg Config, deps Deps) *UI {
	if deps.Now == nil {
		deps.Now = time.Now
	}
	return &UI{cfg: cfg, deps: deps, engines: map[string]engineSample{}}
}

// Observe records an engine's latest scraped metrics (fleet.Config.OnMetrics).
func (u *UI) Observe(engine string, m enginemetrics.Metrics) {
	now := u.deps.Now()
	u.mu.Lock()
	u.engines[engine] = engineSample{m, now}
	u.mu.Unlock()
}

// Forget drops an engine that left the fleet.
func (u *UI) Forget(engine string) {
	u.mu.Lock()
	delete(u.engines, engine)
	u.mu.Unlock()
}

// Record adds a routing decision to the recent list. explain must not be
// changed afterwards: it is marshalled when the page reads it (an
// unmarshallable one is left out). It is on the request path: a lock and
// a copy, no allocation of its own once the list is full (BenchmarkRecord).
func (u *UI) Record(model, requestID, replica string, cached, prompt int, explain any) {
	r := recorded{Decision{Time: u.deps.Now(), Model: model, RequestID: requestID, Replica: replica, CachedTokens: cached, PromptTokens: prompt}, explain}
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.recent) < Recent {
		u.recent = append(u.recent, r)
		return
	}
	u.recent[u.next] = r
	u.next = (u.next + 1) % Recent
}

// recentDecisions returns the recent decisions, newest first, with their
// explain records marshalled.
func (u *UI) recentDecisions() []Decision {
	u.mu.Lock()
	rs := make([]recorded, 0, len(u.recent))
	for i := range u.recent {
		rs = append(rs, u.recent[(u.next-1-i+2*len(u.recent))%len(u.recent)])
	}
	u.mu.Unlock()
	out := make([]Decision, len(rs))
	for i, r := range rs {
		out[i] = r.d
		if r.explain != nil {
			if b, err := json.Marshal(r.explain); err == nil {
				out[i].Explain = b
			}
		}
	}
	return out
}

// Handler serves GET /ui (the page) and GET /ui/state (the JSON).
func (u *UI) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /ui", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Content-Security-Policy", "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:")
		w.Header().Set("Cache-Control", "no-store")
		_, _ = w.Write(page)
	})
	mux.HandleFunc("GET /ui/state", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_ = json.NewEncoder(w).Encode(u.State())
	})
	return u.auth(mux)
}

// auth requires the API key, when one is set, as a bearer token or the
// basic-authentication password.
func (u *UI) auth(h http.Handler) http.Handler {
	if u.cfg.APIKey == "" {
		return h
	}
	key := []byte(u.cfg.APIKey)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok && subtle.ConstantTimeCompare([]byte(got), key) == 1 {
			h.ServeHTTP(w, r)
			return
		}
		if _, pass, ok := r.BasicAuth(); ok && subtle.ConstantTimeCompare([]byte(pass), key) == 1 {
			h.ServeHTTP(w, r)
			return
		}
		w.Header().Set("WWW-Authenticate", `Basic realm="kvrouter (password: the API key)", charset="UTF-8"`)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = w.Write([]byte(`{"error":{"message":"invalid API key","type":"authentication_error","param":null,"code":401}}`))
	})
}

// basic returns the Authorization header value of basic authentication
// with password key (tests).
func basic(key string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte("kvrouter:"+key))
}
