package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sync"
)

// ListModels asks every up endpoint for GET /v1/models, concurrently, and
// returns the union of the "data" entries, first seen wins per "id", in
// configuration order. Endpoints that fail or time out (ProbeTimeout) are
// skipped and returned as errs, so one engine down never fails the listing.
func (f *Fleet) ListModels(ctx context.Context) (cards []json.RawMessage, errs []error) {
	res := make([][]json.RawMessage, len(f.all))
	errv := make([]error, len(f.all))
	var wg sync.WaitGroup
	for i, ep := range f.all {
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
	for i := range f.all {
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
