package fleet

import (
	"maps"
	"slices"
)

// AdapterParent reports whether the endpoint's last GET /v1/models listing
// (or NoteAdapter since) names the LoRA adapter name, and its parent: vLLM
// lists each loaded adapter as a card whose "parent" is the base model's
// served name (vllm/entrypoints/openai/models/serving.py,
// OpenAIServingModels.show_available_models). False while no listing has
// succeeded.
func (e *Endpoint) AdapterParent(name string) (parent string, ok bool) {
	l := e.listing.Load()
	if l == nil {
		return "", false
	}
	parent, ok = l.parent[name]
	return parent, ok
}

// Listed reports whether the endpoint's last listing had a model card with
// id name (a base model or an adapter).
func (e *Endpoint) Listed(name string) bool {
	l := e.listing.Load()
	return l != nil && slices.Contains(l.ids, name)
}

// NoteAdapter records that adapter name with parent is now loaded on the
// endpoint (a successful POST /v1/load_lora_adapter), until the next
// listing replaces what is known.
func (e *Endpoint) NoteAdapter(name, parent string) {
	for {
		old := e.listing.Load()
		next := &listing{maxLen: map[string]int{}, parent: map[string]string{}}
		if old != nil {
			next.ids = slices.Clone(old.ids)
			next.maxLen = maps.Clone(old.maxLen)
			next.parent = maps.Clone(old.parent)
		}
		if next.maxLen == nil {
			next.maxLen = map[string]int{}
		}
		if next.parent == nil {
			next.parent = map[string]string{}
		}
		if !slices.Contains(next.ids, name) {
			next.ids = append(next.ids, name)
		}
		next.parent[name] = parent
		if n, ok := next.maxLen[parent]; ok {
			next.maxLen[name] = n
		}
		if e.listing.CompareAndSwap(old, next) {
			return
		}
	}
}
