package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"kvrouter/internal/admission"
	"kvrouter/internal/group"
	"net/http"
	"strings"
	"sync"
	"time"

	"kvrouter/internal/config"
	"kvrouter/internal/fleet"
	"kvrouter/internal/request"
)

// LoRA adapters.
//
// vLLM serves LoRA adapters on top of a base model (vllm serve --enable-lora
// --lora-modules NAME=PATH, or POST /v1/load_lora_adapter at run time when
// VLLM_ALLOW_RUNTIME_LORA_UPDATING=True); a request names the adapter as
// its model, and GET /v1/models lists each adapter with "parent" = the
// base's served name (vllm/entrypoints/openai/models/serving.py). An
// adapter's blocks carry its name as an extra key of every block
// (vllm/v1/core/kv_cache_utils.py generate_block_hash_extra_keys), so they
// never match the base model's: the router keys the request with the same
// extra key (kvindex.Extras.LoRA).
//
// kvrouter serves an adapter in the group of its base model: configured
// (config.Model.Adapters) or learned from an engine's listing (a card whose
// parent is the group's name). A request for it goes only to engines whose
// last listing has it; when none has it and config.Model.AdapterLoading is
// "load" and the adapter has a path, the group's router picks among all
// healthy engines (no engine holds a block of the adapter, so the choice is
// the least costly by load) and kvrouter loads it there with POST
// /v1/load_lora_adapter {"lora_name", "lora_path"} before forwarding.

// adapterTimeout bounds one POST /v1/load_lora_adapter.
const adapterTimeout = 2 * time.Minute

// adapterModel returns the group serving adapter name
// (admission.Core.AdapterGroup).
func (s *Server) adapterModel(name string) (*model, bool) {
	if g := s.core.AdapterGroup(name); g != nil {
		return s.models[g.Cfg.Name], true
	}
	return nil, false
}

// adapterFeature serves a request naming one of the group's LoRA adapters
// as its model: routed with the adapter's key, to engines that have it, or
// loaded on the chosen one (hooks route, engines, chosen).
type adapterFeature struct{ s *Server }

// Admit adds x's adapter key to its route when x names an adapter.
func (f adapterFeature) Admit(_ context.Context, x *admission.Flow) *request.Error {
	if x.Req.Model == x.Group.Cfg.Name {
		return nil // the base model (or an alias of it)
	}
	name := x.Req.Model
	x.AddRoute(func(in *group.RouteInput) { in.LoRA = name })
	return nil
}

// plug narrows x's engines to the adapter's holders and loads it on the
// chosen one when none holds it, when x names an adapter.
func (f adapterFeature) plug(_ context.Context, x *exchange, m *model) {
	if x.Req.Model == m.Cfg.Name {
		return // the base model (or an alias of it)
	}
	a := &adapterUse{name: x.Req.Model, m: m}
	x.hooks.addEngines(a.engines)
	x.hooks.chosen = func(ctx context.Context, x *exchange, ep *fleet.Endpoint) bool {
		if !a.load {
			return true
		}
		if err := f.s.ensureAdapter(ctx, a, ep); err != nil {
			f.s.fail(x, &apiError{status: http.StatusServiceUnavailable, typ: typeServiceUnavailable, retryAfter: time.Second,
				message: fmt.Sprintf("LoRA adapter %q could not be loaded on replica %s (request id %s)", a.name, ep.Name(), x.ID)}, outcomeUpstream)
			x.err = err
			return false
		}
		return true
	}
}

// adapterUse is one request's adapter: its name, its group, and whether
// the engines listed last have none that holds it (load it on the chosen
// one).
type adapterUse struct {
	name string
	m    *model
	load bool
}

// path is the configured lora_path of the adapter ("" none).
func (a *adapterUse) path() string {
	for _, c := range a.m.Cfg.Adapters {
		if c.Name == a.name {
			return c.Path
		}
	}
	return ""
}

// engines keeps the healthy engines that list the adapter, or, when none
// does and loading is configured, all of them (load set).
func (a *adapterUse) engines(eps []*fleet.Endpoint) ([]*fleet.Endpoint, error) {
	var out []*fleet.Endpoint
	for _, ep := range eps {
		if ep.Listed(a.name) {
			out = append(out, ep)
		}
	}
	a.load = false
	if len(out) > 0 {
		return out, nil
	}
	if a.m.Cfg.AdapterLoading == config.AdapterLoadingLoad && a.path() != "" {
		a.load = true
		return withFreeLoRASlot(eps, 0), nil
	}
	return nil, fmt.Errorf("adapter %q: no healthy engine has it loaded: %w", a.name, fleet.ErrNoEndpoint)
}

// healthy returns the engines that may serve x: the healthy engines of its
// model group, narrowed by its features (hooks.engines).
func (s *Server) healthy(dst []*fleet.Endpoint, x *exchange) ([]*fleet.Endpoint, time.Duration, error) {
	n := len(dst)
	eps, retry, err := s.deps.Fleet.Healthy(dst, x.m.Cfg.Name)
	if err != nil {
		return eps, retry, err
	}
	keep, err := x.hooks.engines(eps[n:])
	return append(eps[:n], keep...), retry, err
}

// withFreeLoRASlot keeps, of eps[n:], the engines with a free LoRA slot
// or no LoRA figures yet (fleet.Endpoint.FreeLoRASlots), when there is
// one: the adapter loaded there is served at once, where on an engine
// whose batch holds max_loras adapters already its requests wait for one
// to leave. With none free, eps is returned whole.
func withFreeLoRASlot(eps []*fleet.Endpoint, n int) []*fleet.Endpoint {
	var keep []*fleet.Endpoint
	for _, ep := range eps[n:] {
		if k, ok := ep.FreeLoRASlots(); !ok || k > 0 {
			keep = append(keep, ep)
		}
	}
	if len(keep) == 0 || len(keep) == len(eps)-n {
		return eps
	}
	return append(eps[:n], keep...)
}

// adapterLoads merges concurrent loads of one adapter on one engine.
type adapterLoads struct {
	mu      sync.Mutex
	pending map[string]*adapterLoad
}

type adapterLoad struct {
	done chan struct{}
	err  error
}

// ensureAdapter loads adapter a on ep unless ep lists it, waiting for a
// load already under way. Loading takes the engine's time (reading the
// weights), bounded by adapterTimeout and ctx, the client's.
func (s *Server) ensureAdapter(ctx context.Context, a *adapterUse, ep *fleet.Endpoint) error {
	if ep.Listed(a.name) {
		return nil
	}
	key := ep.Name() + "\x00" + a.name
	s.loads.mu.Lock()
	if s.loads.pending == nil {
		s.loads.pending = map[string]*adapterLoad{}
	}
	l, waiting := s.loads.pending[key]
	if !waiting {
		l = &adapterLoad{done: make(chan struct{})}
		s.loads.pending[key] = l
	}
	s.loads.mu.Unlock()
	if waiting {
		select {
		case <-l.done:
			return l.err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), adapterTimeout)
	defer cancel()
	t0 := time.Now()
	l.err = s.loadAdapter(lctx, a, ep)
	group := a.m.Cfg.Name
	if l.err == nil {
		ep.NoteAdapter(a.name, group)
		s.fm.adapterLoads.WithLabelValues(group, ep.Name(), "ok").Inc()
		s.log.Info("LoRA adapter loaded", "model", group, "adapter", a.name, "engine", ep.Name(),
			"load_ms", float64(time.Since(t0).Microseconds())/1000)
	} else {
		s.fm.adapterLoads.WithLabelValues(group, ep.Name(), "error").Inc()
	}
	s.loads.mu.Lock()
	delete(s.loads.pending, key)
	s.loads.mu.Unlock()
	close(l.done)
	return l.err
}

// loadAdapter sends POST /v1/load_lora_adapter to ep. vLLM answers 200
// with a text body, or 400 when the adapter is already loaded (counted as
// loaded: another client raced us).
func (s *Server) loadAdapter(ctx context.Context, a *adapterUse, ep *fleet.Endpoint) error {
	body, _ := json.Marshal(map[string]string{"lora_name": a.name, "lora_path": a.path()})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, ep.URL()+"/v1/load_lora_adapter", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if k := ep.APIKey(); k != "" {
		req.Header.Set("Authorization", "Bearer "+k)
	}
	resp, err := a.m.transport.RoundTrip(req)
	if err != nil {
		return fmt.Errorf("load adapter %q on %s: %w", a.name, ep.Name(), err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	switch {
	case resp.StatusCode == http.StatusOK:
		return nil
	case resp.StatusCode == http.StatusBadRequest && strings.Contains(string(msg), "already been loaded"):
		return nil
	}
	return fmt.Errorf("load adapter %q on %s: %w", a.name, ep.Name(), errors.New(resp.Status+": "+truncate(string(msg), 256)))
}
