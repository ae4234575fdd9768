package proxy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// What clients may send and what the router shows them
// (docs/security.md).
//
// Two request parts steer an engine beyond one request: the header
// X-Data-Parallel-Rank pins a request to a data-parallel rank (vLLM
// serving.py _get_data_parallel_rank), and the body's kv_transfer_params
// drives vLLM's KV connector (a P/D leg: do_remote_prefill and the
// prefill engine's address; vLLM's NixlConnector contract). The router sets
// both itself; from a client they are dropped (the header) or refused
// with a 400 (the body field, which the router does not rewrite) unless
// ClientsConfig allows them.
//
// The introspection paths (/metrics, /ui, /v1/route) name engines, their
// URLs and the prefixes each holds: with api_key set they need the key on
// the main listener, and with admin_listen they move to their own listener.

// ClientsConfig lists the engine controls clients may set themselves.
type ClientsConfig struct {
	// AllowDPRank forwards a client's X-Data-Parallel-Rank header when the
	// router does not choose a rank itself (default false: dropped).
	AllowDPRank bool `yaml:"allow_dp_rank"`
	// AllowKVTransferParams forwards a body's kv_transfer_params (default
	// false: the request is answered 400).
	AllowKVTransferParams bool `yaml:"allow_kv_transfer_params"`
}

// maxEcho bounds, in bytes, the client input (a model name, a path) an
// error message repeats; longer input is cut with "...".
const maxEcho = 256

// adminRoutes is the admin listener's handler: /metrics (no key: the
// listener's network is the boundary), /ui (its own key check), /v1/route
// (the API key when set), /health and /ready.
func (s *Server) adminRoutes() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("POST /v1/route", s.auth(s.serveRoute))
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("GET /ready", s.serveReady)
	if s.deps.Gatherer != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(s.deps.Gatherer, promhttp.HandlerOpts{}))
	}
	if s.deps.UI != nil {
		mux.Handle("GET /ui", s.deps.UI)
		mux.Handle("GET /ui/", s.deps.UI)
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		(&apiError{status: http.StatusNotFound, typ: typeNotFound, message: fmt.Sprintf("no route for %s %s on the admin listener", truncate(r.Method, maxEcho), truncate(r.URL.Path, maxEcho))}).write(w)
	})
	return mux
}

// dropClientControls removes a client's rank header from every request
// before a handler sees it (engine requests copy the client's headers),
// unless ClientsConfig allows it.
func (s *Server) dropClientControls(h http.Handler) http.Handler {
	if s.cfg.Clients.AllowDPRank {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, ok := r.Header[RankHeader]; ok {
			r.Header.Del(RankHeader)
			s.lm.clients.WithLabelValues("dp_rank").Inc()
		}
		h.ServeHTTP(w, r)
	})
}

// refuseClientControls returns the 400 for a body with kv_transfer_params
// unless ClientsConfig allows it, else nil.
func (s *Server) refuseClientControls(body []byte) *apiError {
	if s.cfg.Clients.AllowKVTransferParams || !hasTransferParams(body) {
		return nil
	}
	s.lm.clients.WithLabelValues("kv_transfer_params").Inc()
	return badRequest("kv_transfer_params", "kv_transfer_params is set by the router, not by clients (clients.allow_kv_transfer_params)")
}

// hasTransferParams reports whether the JSON object body has a top-level
// kv_transfer_params that is not null (vLLM's default), its key compared
// after unescaping as vLLM's pydantic reads it (and, as encoding/json
// matches keys, regardless of case). A body with neither the key's bytes
// nor an escape is answered by one scan; others are decoded without
// keeping any value but that one.
func hasTransferParams(body []byte) bool {
	if !bytes.Contains(body, []byte(`"kv_transfer_params"`)) && !bytes.Contains(body, []byte(`\u`)) {
		return false
	}
	var top struct {
		P json.RawMessage `json:"kv_transfer_params"`
	}
	if json.Unmarshal(body, &top) != nil {
		return false // parseRequest refuses it
	}
	return !isNull(top.P)
}
