package admission

import (
	"context"
	"encoding/json"
	"fmt"

	"kvrouter/internal/group"
	"kvrouter/internal/tokenizer"
)

// TokenSource adapts a tokenizer.Source (local tokenizer and chat template,
// the engine's render endpoints, or both) to Tokenizer.
type TokenSource struct {
	Src *tokenizer.Source
}

var _ group.Tokenizer = TokenSource{}

// Tokens implements Tokenizer: a chat body is decoded as vLLM reads it
// (messages, tools, add_generation_prompt, chat_template_kwargs) and
// rendered; a completion's text is encoded with the body's
// add_special_tokens (default true, as vLLM).
func (t TokenSource) Tokens(ctx context.Context, chat bool, body []byte, text string) ([]uint32, error) {
	if chat {
		var req tokenizer.ChatRequest
		if err := json.Unmarshal(body, &req); err != nil {
			return nil, fmt.Errorf("chat request: %w", err)
		}
		return t.Src.Chat(ctx, req)
	}
	special := struct {
		AddSpecialTokens *bool `json:"add_special_tokens"`
	}{}
	_ = json.Unmarshal(body, &special) // the body was validated already
	add := special.AddSpecialTokens == nil || *special.AddSpecialTokens
	return t.Src.Completion(ctx, text, add)
}

// textRouter is a Router that may route by prompt text. RouteInput builds
// group.RouteInput.Text, which costs a decode of every chat message, only
// when UsesText reports true.
type textRouter interface {
	group.Router
	UsesText() bool
}

var _ textRouter = (*group.Backend)(nil)
