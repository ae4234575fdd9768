package enginesim

import (
	"fmt"
	"net/http"

	"kvrouter/internal/vllm"
)

// renderedRequest is vLLM's GenerateRequest, the answer of the render
// endpoints (vllm/entrypoints/serve/disagg/protocol.py; built by
// vllm/entrypoints/serve/render/serving.py): the prompt's token ids with
// multimodal placeholders expanded, and for a prompt with images its
// features (MultiModalFeatures: per-modality hashes and placeholder
// ranges; kwargs_data, the processed tensors, is null here).
type renderedRequest struct {
	RequestID        string            `json:"request_id"`
	TokenIDs         []uint32          `json:"token_ids"`
	Features         *renderedFeatures `json:"features"`
	SamplingParams   map[string]any    `json:"sampling_params"`
	Model            string            `json:"model"`
	Stream           bool              `json:"stream"`
	StreamOptions    *streamOptions    `json:"stream_options"`
	CacheSalt        *string           `json:"cache_salt"`
	Priority         int               `json:"priority"`
	KVTransferParams map[string]any    `json:"kv_transfer_params"`
}

type renderedFeatures struct {
	MMHashes       map[string][]string           `json:"mm_hashes"`
	MMPlaceholders map[string][]placeholderRange `json:"mm_placeholders"`
	KwargsData     map[string][]*string          `json:"kwargs_data"`
}

type placeholderRange struct {
	Offset int `json:"offset"`
	Length int `json:"length"`
}

// render serves POST /v1/chat/completions/render (one GenerateRequest) and
// /v1/completions/render (a list, one per prompt), validating as the
// generate endpoints do, without running anything.
func (s *Server) render(chat bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		body, ok := s.readBody(w, r)
		if !ok {
			return
		}
		req, err := decodeGenRequest(body)
		if err != nil {
			writeError(w, http.StatusBadRequest, err.Error())
			return
		}
		if _, ok := s.loraFor(req.Model); !ok {
			writeError(w, http.StatusNotFound, fmt.Sprintf("The model `%s` does not exist.", req.Model))
			return
		}
		prompts, mm, ok := s.prompts(w, req, body, chat)
		if !ok {
			return
		}
		prefix := "cmpl-"
		if chat {
			prefix = "chatcmpl-"
		}
		out := make([]renderedRequest, 0, len(prompts))
		for _, p := range prompts {
			mt, msg := s.maxTokens(req, chat, len(p))
			if msg != "" {
				writeError(w, http.StatusBadRequest, msg)
				return
			}
			rr := renderedRequest{RequestID: newID(prefix), TokenIDs: p, SamplingParams: map[string]any{"max_tokens": mt},
				Model: req.Model, Stream: req.Stream, CacheSalt: req.CacheSalt}
			if chat && len(mm) > 0 {
				rr.Features = featuresOf(mm)
			}
			out = append(out, rr)
		}
		if chat {
			writeJSON(w, out[0])
			return
		}
		writeJSON(w, out)
	}
}

// featuresOf lays a chat's image items out as vLLM's MultiModalFeatures.
func featuresOf(mm []vllm.MMFeature) *renderedFeatures {
	f := &renderedFeatures{MMHashes: map[string][]string{}, MMPlaceholders: map[string][]placeholderRange{}}
	for _, it := range mm {
		f.MMHashes["image"] = append(f.MMHashes["image"], it.Identifier)
		f.MMPlaceholders["image"] = append(f.MMPlaceholders["image"], placeholderRange{it.Offset, it.Length})
	}
	return f
}
