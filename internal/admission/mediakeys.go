package admission

import (
	"context"
	"encoding/json"
	"fmt"

	"kvrouter/internal/group"
	"kvrouter/internal/kvindex"
	"kvrouter/internal/tokenizer"
)

// Block keys of prompts with images (and other media).
//
// The engine's render endpoint (POST /v1/chat/completions/render) answers
// the prompt's token ids with each item's placeholder tokens expanded, and
// the items' hashes and placeholder ranges ("features": mm_hashes,
// mm_placeholders; vllm/entrypoints/serve/render/serving.py). vLLM keys a
// block that overlaps an item with (identifier, offset of the item from the
// block's start) among its extra keys (vllm/v1/core/kv_cache_utils.py
// _gen_mm_extra_hash_keys), so equal placeholder tokens of two different
// images never share a block. The router passes the items to the index as
// kvindex.Extras.MM, which keys them the same way (proven against
// testdata/vllm/blockhash.json in kvindex).
//
// Without the items (the engine has no render endpoint and /tokenize
// answered, or no engine render backend at all) the keys of a media prompt
// cannot be made: the request is routed by load, with the prompt length
// (the ids' count, else the text's and the images' estimated visual
// tokens) in the prefill cost.

// Tokenizers that also return the prompt's multimodal items (TokenSource,
// group.FailoverTokenizer) are group.MMTokenizers, asked by group.TokensMM.

var _ group.MMTokenizer = TokenSource{}

// TokensMM is Tokens with a chat's multimodal items from the engine's
// render endpoint (tokenizer.Source.ChatRendered); completions have none.
func (t TokenSource) TokensMM(ctx context.Context, chat bool, body []byte, text string) ([]uint32, []kvindex.MMItem, error) {
	if !chat {
		ids, err := t.Tokens(ctx, false, body, text)
		return ids, nil, err
	}
	var req tokenizer.ChatRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, nil, fmt.Errorf("chat request: %w", err)
	}
	out, err := t.Src.ChatRendered(ctx, req)
	if err != nil {
		return nil, nil, err
	}
	return out.IDs, mmItems(out.MM), nil
}

// mmItems converts the render's items to the index's (nil for none).
func mmItems(items []tokenizer.MMItem) []kvindex.MMItem {
	if len(items) == 0 {
		return nil
	}
	mm := make([]kvindex.MMItem, len(items))
	for i, it := range items {
		mm[i] = kvindex.MMItem{Identifier: it.Identifier, Offset: it.Offset, Length: it.Length}
	}
	return mm
}

// mediaRouteInput completes in for x's media: the items become extra keys;
// a media prompt whose items are unknown is routed by load (no Tokens)
// with its length as the prefill cost: the ids' count, or, with no ids,
// the images' estimated visual tokens (Qwen2VLImageTokens; the text's
// tokens are unknown then, so this is a lower bound).
func mediaRouteInput(x *Flow, in *group.RouteInput) {
	in.MM = x.MM
	if len(x.MM) > 0 || x.Media.Items == 0 {
		return
	}
	if in.Tokens != nil {
		in.PromptTokens = len(in.Tokens)
		in.Tokens = nil
		return
	}
	if in.PromptTokens == 0 {
		in.PromptTokens = x.Media.VisualTokens
	}
}

// chatTokenizer is met by Tokenizers that take a chat request already
// decoded (TokenSource): no second decode of the body.
type chatTokenizer interface {
	// TokensChat is TokensMM for req, decoded from body, with the
	// prompt's link to the tokenizer's prefix cache (nil: none).
	TokensChat(ctx context.Context, req tokenizer.ChatRequest, body []byte) ([]uint32, []kvindex.MMItem, *tokenizer.PrefixMemo, error)
}

var _ chatTokenizer = TokenSource{}

// chatTokens asks tok for req's ids and items, decoded already when tok
// takes it so, else from body; a group.FailoverTokenizer asks its engines'
// tokenizers so in failover order. memo is the prompt's link to the
// prefix cache of the tokenizer that answered (nil: none).
func chatTokens(ctx context.Context, tok group.Tokenizer, req tokenizer.ChatRequest, body []byte) (ids []uint32, mm []kvindex.MMItem, memo *tokenizer.PrefixMemo, err error) {
	switch t := tok.(type) {
	case chatTokenizer:
		return t.TokensChat(ctx, req, body)
	case *group.FailoverTokenizer:
		ids, mm, err = t.Try(ctx, func(tok group.Tokenizer) ([]uint32, []kvindex.MMItem, error) {
			ids, mm, m, err := chatTokens(ctx, tok, req, body)
			memo = m
			return ids, mm, err
		})
		if err != nil {
			memo = nil
		}
		return ids, mm, memo, err
	}
	ids, mm, err = group.TokensMM(ctx, tok, true, body, "")
	return ids, mm, nil, err
}

// TokensChat renders req with the source (tokenizer.Source.ChatRendered).
func (t TokenSource) TokensChat(ctx context.Context, req tokenizer.ChatRequest, _ []byte) ([]uint32, []kvindex.MMItem, *tokenizer.PrefixMemo, error) {
	out, err := t.Src.ChatRendered(ctx, req)
	if err != nil {
		return nil, nil, nil, err
	}
	return out.IDs, mmItems(out.MM), out.Memo, nil
}
