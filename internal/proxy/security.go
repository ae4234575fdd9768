package proxy

import (
	"fmt"
	"net/http"
	"path"
	"strings"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"kvrouter/internal/admission"
	"kvrouter/internal/request"
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
// config.Clients allows them.
//
// The introspection paths (/metrics, /ui, /v1/route) name engines, their
// URLs and the prefixes each holds: with api_key set they need the key on
// the main listener, and with admin_listen they move to their own listener.

// maxEcho bounds, in bytes, the client input (a model name, a path) an
// error message repeats (admission.MaxEcho).
const maxEcho = admission.MaxEcho

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
		mux.Handle("GET /ui/state", s.deps.UI)
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		(&apiError{status: http.StatusNotFound, typ: typeNotFound, message: fmt.Sprintf("no route for %s %s on the admin listener", truncate(r.Method, maxEcho), truncate(r.URL.Path, maxEcho))}).write(w)
	})
	return canonical(mux)
}

// dropClientControls removes a client's rank header from every request
// before a handler sees it (engine requests copy the client's headers),
// unless config.Clients allows it. With an admin listener it also refuses
// x-kvrouter-route-only on the main one: the decision it answers is
// /v1/route's, which lives there.
func (s *Server) dropClientControls(h http.Handler) http.Handler {
	if s.cfg.Clients.AllowDPRank && s.cfg.AdminListen == "" {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.cfg.AdminListen != "" && r.Header.Get("X-Kvrouter-Route-Only") != "" {
			badRequest("", "x-kvrouter-route-only is answered on the admin listener only (POST /v1/route on admin_listen)").write(w)
			return
		}
		if _, ok := r.Header[RankHeader]; ok && !s.cfg.Clients.AllowDPRank {
			r.Header.Del(RankHeader)
			s.lm.clients.WithLabelValues("dp_rank").Inc()
		}
		h.ServeHTTP(w, r)
	})
}

// refuseClientControls returns the 400 for a request whose body has
// kv_transfer_params unless config.Clients allows it, else nil.
func (s *Server) refuseClientControls(req *request.Parsed) *request.Error {
	if s.cfg.Clients.AllowKVTransferParams || !req.HasTransferParams() {
		return nil
	}
	s.lm.clients.WithLabelValues("kv_transfer_params").Inc()
	return request.Invalid("kv_transfer_params", "kv_transfer_params is set by the router, not by clients (clients.allow_kv_transfer_params)")
}

// canonical answers a request whose path is not in canonical form (a
// "." or ".." segment, a repeated or missing "/") with an OpenAI-shaped
// 404 instead of ServeMux's redirect to the cleaned path, which would
// answer in HTML and invite the client to a path it did not ask for. The
// path is compared as sent (percent-encoded), as ServeMux compares it.
// A CONNECT request (the router is no forward proxy) gets the same 404,
// instead of ServeMux's plain-text one.
func canonical(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodConnect {
			(&apiError{status: http.StatusNotFound, typ: typeNotFound,
				message: fmt.Sprintf("no route for CONNECT %s: the router is not a forward proxy", truncate(r.RequestURI, maxEcho))}).write(w)
			return
		}
		if p := r.URL.EscapedPath(); p != canonicalPath(p) {
			(&apiError{status: http.StatusNotFound, typ: typeNotFound,
				message: fmt.Sprintf("no route for %s %s: the path is not in canonical form", truncate(r.Method, maxEcho), truncate(p, maxEcho))}).write(w)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// canonicalPath is p rooted and cleaned (path.Clean), keeping a trailing
// slash: the form ServeMux routes without a redirect.
func canonicalPath(p string) string {
	c := path.Clean("/" + p)
	if strings.HasSuffix(p, "/") && c != "/" {
		c += "/"
	}
	return c
}
