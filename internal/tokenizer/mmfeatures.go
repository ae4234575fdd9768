package tokenizer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
)

// MMItem is one multimodal item (image, audio, video) of a prompt rendered
// by the engine: its content hash and its placeholder tokens' position.
// vLLM's engine copies these into the request's MultiModalFeatureSpec
// (identifier = mm_hash, mm_position = the placeholder range;
// vllm/v1/engine/input_processor.py), from which the block hashes' extra
// keys are made (vllm/v1/core/kv_cache_utils.py _gen_mm_extra_hash_keys).
type MMItem struct {
	// Modality is the key of vLLM's per-modality maps ("image", ...).
	Modality string
	// Identifier is the item's mm_hash (vLLM: a hex digest of the item's
	// data and processor arguments; opaque here).
	Identifier string
	// Offset is the index of the item's first placeholder token.
	Offset int
	// Length is the number of placeholder tokens (> 0).
	Length int
}

// Rendered is a prompt as the engine renders it: its token ids (with the
// multimodal placeholders expanded) and its multimodal items sorted by
// Offset (nil for a text-only prompt, and for ids from /tokenize or the
// local renderer, which report none).
type Rendered struct {
	IDs []uint32
	MM  []MMItem
	// Memo links a locally encoded chat to the prefix cache, for block
	// keys (PrefixMemo); nil otherwise.
	Memo *PrefixMemo
}

// maxMMItems bounds the items of one rendered prompt (vLLM's own default
// --limit-mm-per-prompt is far lower); more is a malformed answer.
const maxMMItems = 4096

// decodeMMFeatures reads the "features" field of vLLM's GenerateRequest
// (vllm/entrypoints/serve/disagg/protocol.py MultiModalFeatures, built by
// vllm/entrypoints/serve/render/serving.py _extract_mm_features):
//
//	null, or {"mm_hashes": {"image": ["<hash>", ...]},
//	          "mm_placeholders": {"image": [{"offset": 5, "length": 64}, ...]},
//	          "kwargs_data": ... (ignored)}
//
// and returns the items of all modalities sorted by offset, as the engine
// orders them (argsort_mm_positions). nTokens is the prompt's length: every
// placeholder must lie within it, and placeholders must not overlap. An
// error describes the first problem; the answer is then not usable.
func decodeMMFeatures(raw json.RawMessage, nTokens int) ([]MMItem, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var f struct {
		Hashes       map[string][]string `json:"mm_hashes"`
		Placeholders map[string][]struct {
			Offset *int `json:"offset"`
			Length *int `json:"length"`
		} `json:"mm_placeholders"`
	}
	if err := json.Unmarshal(raw, &f); err != nil {
		return nil, fmt.Errorf("features: %w", err)
	}
	if len(f.Hashes) != len(f.Placeholders) {
		return nil, fmt.Errorf("features: mm_hashes has %d modalities, mm_placeholders %d", len(f.Hashes), len(f.Placeholders))
	}
	var items []MMItem
	for mod, hs := range f.Hashes {
		ps, ok := f.Placeholders[mod]
		if !ok {
			return nil, fmt.Errorf("features: modality %q has hashes but no placeholders", mod)
		}
		if len(hs) != len(ps) {
			return nil, fmt.Errorf("features: modality %q: %d hashes, %d placeholders", mod, len(hs), len(ps))
		}
		if len(items)+len(hs) > maxMMItems {
			return nil, fmt.Errorf("features: more than %d items", maxMMItems)
		}
		for i, h := range hs {
			p := ps[i]
			switch {
			case h == "":
				return nil, fmt.Errorf("features: mm_hashes[%q][%d] is empty", mod, i)
			case p.Offset == nil || p.Length == nil:
				return nil, fmt.Errorf("features: mm_placeholders[%q][%d]: offset and length are required", mod, i)
			case *p.Offset < 0 || *p.Length < 1 || *p.Length > nTokens || *p.Offset > nTokens-*p.Length:
				return nil, fmt.Errorf("features: mm_placeholders[%q][%d]: offset %d length %d outside the prompt's %d tokens", mod, i, *p.Offset, *p.Length, nTokens)
			}
			items = append(items, MMItem{Modality: mod, Identifier: h, Offset: *p.Offset, Length: *p.Length})
		}
	}
	slices.SortFunc(items, func(a, b MMItem) int { return a.Offset - b.Offset })
	for i := 1; i < len(items); i++ {
		if prev := items[i-1]; items[i].Offset < prev.Offset+prev.Length {
			return nil, fmt.Errorf("features: placeholders at %d (%s) and %d (%s) overlap", prev.Offset, prev.Modality, items[i].Offset, items[i].Modality)
		}
	}
	return items, nil
}
