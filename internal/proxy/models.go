package proxy

import (
	"encoding/json"
	"net/http"
)

// serveModels answers GET /v1/models with the union of the up engines'
// model cards. Engines that fail are skipped: one engine down never fails
// the listing. A configured model no engine listed is added as a bare card
// while it has an up engine.
func (s *Server) serveModels(w http.ResponseWriter, r *http.Request) {
	cards, errs := s.deps.Fleet.ListModels(r.Context())
	for _, err := range errs {
		s.log.Debug("listing models", "err", err)
	}
	seen := map[string]bool{}
	for _, c := range cards {
		var id struct {
			ID string `json:"id"`
		}
		_ = json.Unmarshal(c, &id) // fleet returns only cards with an id
		seen[id.ID] = true
	}
	for _, name := range s.deps.Fleet.Models() {
		if seen[name] {
			continue
		}
		if eps, _, err := s.deps.Fleet.Healthy(nil, name); err == nil && len(eps) > 0 {
			b, _ := json.Marshal(map[string]any{"id": name, "object": "model", "owned_by": "kvrouter"})
			cards = append(cards, b)
		}
	}
	if cards == nil {
		cards = []json.RawMessage{}
	}
	b, err := json.Marshal(struct {
		Object string            `json:"object"`
		Data   []json.RawMessage `json:"data"`
	}{"list", cards})
	if err != nil {
		(serverError(err.Error())).write(w)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}
