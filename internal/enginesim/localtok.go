package enginesim

import (
	"encoding/json"
	"fmt"

	"kvrouter/internal/tokenizer"
)

// localTokenizer is a Hugging Face tokenizer (internal/tokenizer) as the
// simulated engine's Tokenizer.
type localTokenizer struct{ l *tokenizer.Local }

// LoadTokenizer loads the tokenizer directory or tokenizer.json[.gz] at
// path (with tokenizer_config.json beside it for the chat template) as a
// Tokenizer (engine-sim --tokenizer).
func LoadTokenizer(path string) (Tokenizer, error) {
	tok, err := tokenizer.Load(path)
	if err != nil {
		return nil, err
	}
	l, err := tokenizer.NewLocal(tok, tokenizer.ContentAuto)
	if err != nil {
		return nil, fmt.Errorf("chat template: %w", err)
	}
	return &localTokenizer{l: l}, nil
}

func (t *localTokenizer) Encode(text string, addSpecial bool) ([]uint32, error) {
	return t.l.Encode(text, addSpecial), nil
}

func (t *localTokenizer) EncodeChat(body []byte) ([]uint32, error) {
	var req tokenizer.ChatRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, err
	}
	_, ids, err := t.l.EncodeChat(req)
	return ids, err
}
