package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
)

// ListModels asks every up endpoint for GET /v1/models, concurrently, and
// returns the union of the "data" entries, first seen wins per "id", in
// configuration order. Endpoints that fail or time out (ProbeTimeout) are
// skipped and returned as errs, so one engine down never fails the listing.
func (f *Fleet) ListModels(ctx context.Context) (cards []json.RawMessage, errs []error) {
	all := f.All()
	res := make([][]json.RawMessage, len(all))
	errv := make([]error, len(all))
	var wg sync.WaitGroup
	for i, ep := range all {
		if !ep.Up() {
			continue
		}
		wg.Go(func() {
			defer func() {
				if r := recover(); r != nil {
					errv[i] = fmt.Errorf("fleet: list models of %s panicked: %v", ep.name, r)
				}
			}()
			errv[i] = f.get(ctx, ep, "/v1/models", func(r io.Reader) error {
				var err error
				res[i], err = decodeModelList(r)
				return err
			})
		})
	}
	wg.Wait()
	seen := map[string]bool{}
	for i := range all {
		if errv[i] != nil {
			errs = append(errs, errv[i])
			continue
		}
		for _, c := range res[i] {
			var id struct {
				ID string `json:"id"`
			}
			if json.Unmarshal(c, &id) != nil || id.ID == "" || seen[id.ID] {
				continue
			}
			seen[id.ID] = true
			cards = append(cards, c)
		}
	}
	return cards, errs
}

// decodeModelList decodes an OpenAI model list {"object":"list","data":[...]}
// and returns the entries that are JSON objects.
func decodeModelList(r io.Reader) ([]json.RawMessage, error) {
	var list struct {
		Data []json.RawMessage `json:"data"`
	}
	if err := json.NewDecoder(r).Decode(&list); err != nil {
		return nil, fmt.Errorf("decode model list: %w", err)
	}
	out := list.Data[:0]
	for _, c := range list.Data {
		if len(c) > 0 && c[0] == '{' {
			out = append(out, c)
		}
	}
	return out, nil
}

// listing is what one GET /v1/models of an endpoint answered.
type listing struct {
	// ids are the served model ids (data[].id) in listing order.
	ids []string
	// maxLen maps an id to its card's max_model_len, when the card has one.
	maxLen map[string]int
	// parent maps a LoRA adapter's id to its card's parent (the base model).
	parent map[string]string
}

// newListing reads the ids and max_model_len of decoded model cards; cards
// without a string id are skipped. vLLM puts max_model_len on the base
// model's card only (an adapter's card has it null and names the base as
// "parent"), so a card without one takes its parent's.
func newListing(cards []json.RawMessage) *listing {
	l := &listing{maxLen: make(map[string]int, len(cards))}
	parents := map[string]string{}
	for _, c := range cards {
		var card struct {
			ID          string  `json:"id"`
			Parent      *string `json:"parent"`
			MaxModelLen *int    `json:"max_model_len"`
		}
		if json.Unmarshal(c, &card) != nil || card.ID == "" || slices.Contains(l.ids, card.ID) {
			continue
		}
		l.ids = append(l.ids, card.ID)
		if card.MaxModelLen != nil && *card.MaxModelLen > 0 {
			l.maxLen[card.ID] = *card.MaxModelLen
		}
		if card.Parent != nil {
			parents[card.ID] = *card.Parent
		}
	}
	l.parent = parents
	for id, p := range parents {
		if _, own := l.maxLen[id]; own {
			continue
		}
		if n, ok := l.maxLen[p]; ok {
			l.maxLen[id] = n
		}
	}
	return l
}

// MaxModelLen is the engine's max_model_len for model, in tokens (prompt
// plus output, vLLM's --max-model-len), from its last successful GET
// /v1/models listing (vLLM's ModelCard.max_model_len; a LoRA adapter's
// card has none and gets its parent's); 0 when unknown: no listing yet,
// the model not listed, or no figure on its card or its parent's. The listing is refreshed every
// Config.ModelsInterval. One atomic load and a map read: fine per request.
func (e *Endpoint) MaxModelLen(model string) int {
	l := e.listing.Load()
	if l == nil {
		return 0
	}
	return l.maxLen[model]
}

// modelMissing reports whether the last listing lacked model.
func (e *Endpoint) modelMissing(model string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.missing[model]
}

// checkModels asks ep for GET /v1/models, keeps the listing (MaxModelLen)
// and compares it with ep's configured model names: a name the engine does
// not serve makes ep not ready for that model (EndpointState.ModelMissing),
// sets kvrouter_fleet_model_not_served to 1 and logs one line naming the
// configured and the served names; a change back is logged too. A failed
// listing changes nothing (readiness rests on /health then).
func (f *Fleet) checkModels(ctx context.Context, ep *Endpoint) {
	var cards []json.RawMessage
	err := f.get(ctx, ep, "/v1/models", func(r io.Reader) error {
		var err error
		cards, err = decodeModelList(r)
		return err
	})
	if ctx.Err() != nil {
		return
	}
	if err != nil {
		f.log.Debug("model listing failed", "endpoint", ep.name, "err", err)
		return
	}
	l := newListing(cards)
	ep.listing.Store(l)
	served := strings.Join(l.ids, ",")
	type change struct {
		model   string
		missing bool
	}
	var changes []change
	var gauges []change
	ep.mu.Lock()
	if ep.missing == nil {
		ep.missing = map[string]bool{}
	}
	anyMissing := false
	for _, m := range ep.models {
		miss := !slices.Contains(l.ids, m)
		anyMissing = anyMissing || miss
		gauges = append(gauges, change{m, miss})
		if ep.missing[m] != miss || (miss && ep.notedServed != served) {
			changes = append(changes, change{m, miss})
		}
		ep.missing[m] = miss
	}
	if anyMissing {
		ep.notedServed = served
	}
	ep.mu.Unlock()
	for _, g := range gauges {
		v := 0.0
		if g.missing {
			v = 1
		}
		f.withMetrics(ep, func(m *metrics) { m.notServed.WithLabelValues(ep.name, g.model).Set(v) })
	}
	for _, c := range changes {
		if c.missing {
			f.log.Error("engine does not serve the configured model name: requests for it would get the engine's 404, so it is not ready for it",
				"endpoint", ep.name, "model", c.model, "served", l.ids)
		} else {
			f.log.Info("engine serves the configured model name", "endpoint", ep.name, "model", c.model)
		}
	}
}
