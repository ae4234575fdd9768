package proxy

import (
	"encoding/json"
	"net/http"

	"kvrouter/internal/config"
)

// readiness is the body of GET /ready.
type readiness struct {
	// Ready is the verdict the status code carries (200 or 503).
	Ready bool `json:"ready"`
	// Mode is "any" (default: every model has one usable engine) or "all"
	// (?full=1: every engine is usable).
	Mode   string         `json:"mode"`
	Models []modelReadies `json:"models"`
}

type modelReadies struct {
	Model string `json:"model"`
	Ready bool   `json:"ready"`
	// Index is "exact" (fed by KV events: an engine counts only with its
	// stream connected) or "approx".
	Index string `json:"index"`
	// ReadyEngines and TotalEngines count the model's engines that are
	// ready and all of them.
	ReadyEngines int `json:"ready_engines"`
	TotalEngines int `json:"total_engines"`
	// Engines is each engine's state; absent where the body is summarized
	// (the main listener beside an admin listener: engine names are
	// addresses).
	Engines []engineReady `json:"engines,omitempty"`
}

type engineReady struct {
	Name string `json:"name"`
	// Up: not ejected. Probed: a /health probe has succeeded.
	Up     bool `json:"up"`
	Probed bool `json:"probed"`
	// Panic: down for timeouts alone but routed, its model being in panic
	// mode (fleet.Config.PanicThreshold).
	Panic bool `json:"panic,omitempty"`
	// ModelMissing: the engine's GET /v1/models does not list the model.
	ModelMissing bool `json:"model_missing,omitempty"`
	// Events: "connected", "disconnected", or "none" (no events endpoint).
	Events string `json:"events"`
	// Ready: this engine counts towards its model's readiness.
	Ready bool `json:"ready"`
}

// exact reports whether the model routes with the event-fed index: what
// its router says when it can (a Backend: indexKind), else whether any
// engine router.yaml lists has an events endpoint (as cmd/kvrouter builds
// it). Engines from discovery are listed nowhere in the config, so only the
// router knows for them.
func (s *Server) exact(m config.Model) bool {
	if r, ok := s.deps.Routers[m.Name].(indexKind); ok {
		return r.Exact()
	}
	for _, e := range m.Engines {
		if e.Events != "" {
			return true
		}
	}
	return false
}

// indexKind is a Router that tells which index it routes with.
type indexKind interface {
	// Exact reports whether it is the event-fed index.
	Exact() bool
}

// readiness evaluates GET /ready. An engine is ready when it is up, has
// passed a probe, and, for a model on the event-fed index, has its KV event
// stream connected (an engine of such a model without events, or with its
// stream down, serves but is not counted: the index does not see it). A
// model is ready when one of its engines is; the server when every model
// is — or, with all, when every engine is.
func (s *Server) readiness(all bool) readiness {
	var connected map[string]bool
	if s.deps.EventsConnected != nil {
		connected = s.deps.EventsConnected()
	}
	out := readiness{Ready: true, Mode: "any"}
	if all {
		out.Mode = "all"
	}
	for _, mc := range s.cfg.Models {
		exact := s.exact(mc)
		mr := modelReadies{Model: mc.Name, Index: "approx"}
		if exact {
			mr.Index = "exact"
		}
		states := s.deps.Fleet.States(mc.Name)
		allReady := len(states) > 0
		for j, st := range states {
			er := engineReady{Name: st.Name, Up: st.Up, Probed: st.Probed, Panic: st.Panic, ModelMissing: st.ModelMissing, Events: "none"}
			// An engine has an event stream when its subscriber reports one
			// (listed or discovered) or router.yaml gives it an endpoint.
			up, subscribed := connected[st.Name]
			switch {
			case up:
				er.Events = "connected"
			case subscribed || j < len(mc.Engines) && mc.Engines[j].Events != "":
				er.Events = "disconnected"
			}
			er.Ready = st.Routable() && (!exact || er.Events == "connected")
			mr.Ready = mr.Ready || er.Ready
			mr.TotalEngines++
			if er.Ready {
				mr.ReadyEngines++
			}
			allReady = allReady && er.Ready
			mr.Engines = append(mr.Engines, er)
		}
		if all {
			mr.Ready = allReady
		}
		out.Ready = out.Ready && mr.Ready
		out.Models = append(out.Models, mr)
	}
	return out
}

// serveReady answers GET /ready: 200 when ready, else 503, with the
// per-model, per-engine state as JSON either way. ?full=1 asks for every
// engine (for tests and demos that need the whole fleet), not one per
// model (the Kubernetes readiness semantics: losing one of N replicas
// degrades, it does not take the router out).
func (s *Server) serveReady(w http.ResponseWriter, r *http.Request) {
	s.answerReady(w, r, true)
}

// serveReadySummary is serveReady without the engines: each model's
// verdict and engine counts only, for the main listener when an admin
// listener serves the whole body (engine names are their addresses).
func (s *Server) serveReadySummary(w http.ResponseWriter, r *http.Request) {
	s.answerReady(w, r, false)
}

func (s *Server) answerReady(w http.ResponseWriter, r *http.Request, engines bool) {
	v := r.URL.Query().Get("full")
	rd := s.readiness(v != "" && v != "0" && v != "false")
	if !engines {
		for i := range rd.Models {
			rd.Models[i].Engines = nil
		}
	}
	b, err := json.Marshal(rd)
	if err != nil {
		(&apiError{status: http.StatusInternalServerError, typ: typeServer, message: "encoding readiness"}).write(w)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	if !rd.Ready {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_, _ = w.Write(b)
}
