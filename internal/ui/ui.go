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
	recent  []Decision              // ring of the last Recent, oldest first once full
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

// Record adds a routing decision to the recent list; explain is marshalled
// now (an unmarshallable one is left out).
func (u *UI) Record(model, requestID, replica string, cached, prompt int, explain any) {
	d := Decision{Time: u.deps.Now(), Model: model, RequestID: requestID, Replica: replica, CachedTokens: cached, PromptTokens: prompt}
	if explain != nil {
		if b, err := json.Marshal(explain); err == nil {
			d.Explain = b
		}
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.recent) < Recent {
		u.recent = append(u.recent, d)
		return
	}
	u.recent[u.next] = d
	u.next = (u.next + 1) % Recent
}

// recentDecisions returns the recent decisions, newest first.
func (u *UI) recentDecisions() []Decision {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := make([]Decision, 0, len(u.recent))
	for i := range u.recent {
		j := (u.next - 1 - i + 2*len(u.recent)) % len(u.recent)
		out = append(out, u.recent[j])
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
