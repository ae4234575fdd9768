package tokenizer

import (
	"encoding/json"
	"fmt"
)

// Config holds the tokenizer_config.json facts that callers outside the
// encoder need (chat templates, BOS/EOS). The zero value means the file was
// absent.
type Config struct {
	// ChatTemplate is the raw "chat_template" value: a JSON string, or a
	// list of {"name": ..., "template": ...} objects; nil when absent.
	ChatTemplate json.RawMessage
	// BOSToken and EOSToken are the "bos_token"/"eos_token" contents; the
	// JSON may hold a plain string or an object with a "content" field.
	// Empty when absent or null.
	BOSToken, EOSToken string
	// AddBOSToken and AddEOSToken are "add_bos_token"/"add_eos_token"
	// (false when absent). Encode does not consult them: the
	// tokenizer.json post-processor alone decides which special tokens
	// Encode adds, as in Hugging Face tokenizers.
	AddBOSToken, AddEOSToken bool
	// Raw is every top-level key of tokenizer_config.json, undecoded.
	Raw map[string]json.RawMessage
}

// parseConfig decodes tokenizer_config.json. A nil or empty input gives
// the zero Config.
func parseConfig(data []byte) (Config, error) {
	var c Config
	if len(data) == 0 {
		return c, nil
	}
	if err := json.Unmarshal(data, &c.Raw); err != nil {
		return c, fmt.Errorf("tokenizer_config.json: %w", err)
	}
	if v, ok := c.Raw["chat_template"]; ok && string(v) != "null" {
		c.ChatTemplate = v
	}
	var err error
	if c.BOSToken, err = tokenContent(c.Raw["bos_token"]); err != nil {
		return c, fmt.Errorf("tokenizer_config.json bos_token: %w", err)
	}
	if c.EOSToken, err = tokenContent(c.Raw["eos_token"]); err != nil {
		return c, fmt.Errorf("tokenizer_config.json eos_token: %w", err)
	}
	if c.AddBOSToken, err = optBool(c.Raw["add_bos_token"]); err != nil {
		return c, fmt.Errorf("tokenizer_config.json add_bos_token: %w", err)
	}
	if c.AddEOSToken, err = optBool(c.Raw["add_eos_token"]); err != nil {
		return c, fmt.Errorf("tokenizer_config.json add_eos_token: %w", err)
	}
	return c, nil
}

// tokenContent reads a special-token field that is a string, an
// AddedToken-like object with "content", or null/absent.
func tokenContent(v json.RawMessage) (string, error) {
	if len(v) == 0 || string(v) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(v, &s); err == nil {
		return s, nil
	}
	var obj struct {
		Content *string `json:"content"`
	}
	if err := json.Unmarshal(v, &obj); err != nil {
		return "", err
	}
	if obj.Content == nil {
		return "", fmt.Errorf("object without \"content\"")
	}
	return *obj.Content, nil
}

func optBool(v json.RawMessage) (bool, error) {
	if len(v) == 0 || string(v) == "null" {
		return false, nil
	}
	var b bool
	err := json.Unmarshal(v, &b)
	return b, err
}
