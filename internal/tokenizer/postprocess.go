package tokenizer

import (
	"encoding/json"
	"fmt"
)

// post is the compiled post-processor for single sequences: ids put before
// and after the encoding when special tokens are requested.
type post struct {
	prefix, suffix []uint32
}

// parsePostProcessor decodes "post_processor". The special-token ids come
// from the JSON itself (RobertaProcessing/BertProcessing "cls"/"sep",
// TemplateProcessing "special_tokens"), as in Hugging Face.
func parsePostProcessor(raw json.RawMessage) (post, error) {
	var p post
	if isNull(raw) {
		return p, nil
	}
	var t typed
	if err := json.Unmarshal(raw, &t); err != nil {
		return p, err
	}
	switch t.Type {
	case "ByteLevel":
		return p, nil // offsets only
	case "Sequence":
		var s struct {
			Processors []json.RawMessage `json:"processors"`
		}
		if err := json.Unmarshal(raw, &s); err != nil {
			return p, fmt.Errorf("%s: %w", t.Type, err)
		}
		for i, r := range s.Processors {
			q, err := parsePostProcessor(r)
			if err != nil {
				return p, fmt.Errorf("%s[%d]: %w", t.Type, i, err)
			}
			p.prefix = append(append([]uint32(nil), q.prefix...), p.prefix...)
			p.suffix = append(p.suffix, q.suffix...)
		}
		return p, nil
	case "TemplateProcessing":
		return parseTemplate(raw)
	case "RobertaProcessing", "BertProcessing":
		var r struct {
			Sep [2]json.RawMessage `json:"sep"`
			Cls [2]json.RawMessage `json:"cls"`
		}
		if err := json.Unmarshal(raw, &r); err != nil {
			return p, fmt.Errorf("%s: %w", t.Type, err)
		}
		var cls, sep uint32
		if err := json.Unmarshal(r.Cls[1], &cls); err != nil {
			return p, fmt.Errorf("%s cls: %w", t.Type, err)
		}
		if err := json.Unmarshal(r.Sep[1], &sep); err != nil {
			return p, fmt.Errorf("%s sep: %w", t.Type, err)
		}
		return post{prefix: []uint32{cls}, suffix: []uint32{sep}}, nil
	default:
		return p, fmt.Errorf("type %q not supported", t.Type)
	}
}

// parseTemplate compiles TemplateProcessing's "single" template.
func parseTemplate(raw json.RawMessage) (post, error) {
	var p post
	var tp struct {
		Single []struct {
			SpecialToken *struct {
				ID string `json:"id"`
			} `json:"SpecialToken"`
			Sequence *struct {
				ID string `json:"id"`
			} `json:"Sequence"`
		} `json:"single"`
		SpecialTokens map[string]struct {
			IDs []uint32 `json:"ids"`
		} `json:"special_tokens"`
	}
	if err := json.Unmarshal(raw, &tp); err != nil {
		return p, fmt.Errorf("TemplateProcessing: %w", err)
	}
	seen := false
	for i, piece := range tp.Single {
		switch {
		case piece.Sequence != nil:
			if seen {
				return p, fmt.Errorf("TemplateProcessing single[%d]: second sequence", i)
			}
			seen = true
		case piece.SpecialToken != nil:
			st, ok := tp.SpecialTokens[piece.SpecialToken.ID]
			if !ok {
				return p, fmt.Errorf("TemplateProcessing single[%d]: special token %q not in special_tokens", i, piece.SpecialToken.ID)
			}
			if seen {
				p.suffix = append(p.suffix, st.IDs...)
			} else {
				p.prefix = append(p.prefix, st.IDs...)
			}
		default:
			return p, fmt.Errorf("TemplateProcessing single[%d]: neither SpecialToken nor Sequence", i)
		}
	}
	if !seen {
		return p, fmt.Errorf("TemplateProcessing single: no sequence")
	}
	return p, nil
}
