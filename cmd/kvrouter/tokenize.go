package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"

	"kvrouter/internal/tokenizer"
)

// maxTokenizeInput bounds what "kvrouter tokenize" reads from stdin.
const maxTokenizeInput = 256 << 20

// tokenizeOutput is the command's JSON answer; Text is the rendered prompt
// (only with --chat).
type tokenizeOutput struct {
	IDs  []uint32 `json:"ids"`
	Text *string  `json:"text,omitempty"`
}

// runTokenize implements "kvrouter tokenize --tokenizer PATH [--chat]
// [--no-special]": stdin is the text, taken byte for byte (no newline is
// stripped), or with --chat a JSON chat body {"messages", "tools",
// "add_generation_prompt" (default true), "chat_template_kwargs"} rendered
// with the model's chat template; stdout is {"ids":[...]} plus "text" with
// --chat. Chats are encoded without added special tokens, as vLLM encodes
// them, so --no-special only affects plain text.
func runTokenize(ctx context.Context, args []string, sio stdio) error {
	fs := newFlagSet("tokenize", "--tokenizer PATH [--chat] [--no-special] < input", sio.err)
	path := fs.String("tokenizer", "", "tokenizer directory, or a tokenizer.json[.gz] file (tokenizer_config.json is read beside it)")
	chat := fs.Bool("chat", false, "stdin is a JSON chat request; render it with the chat template, print the prompt as \"text\"")
	noSpecial := fs.Bool("no-special", false, "encode plain text with add_special_tokens=false")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *path == "" {
		return fmt.Errorf("%w: --tokenizer is required", errUsage)
	}
	input, err := io.ReadAll(io.LimitReader(sio.in, maxTokenizeInput+1))
	if err != nil {
		return fmt.Errorf("read stdin: %w", err)
	}
	if len(input) > maxTokenizeInput {
		return fmt.Errorf("stdin larger than %d bytes", maxTokenizeInput)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	var out tokenizeOutput
	if out.IDs, out.Text, err = tokenizer.EncodeInput(*path, input, *chat, *noSpecial); err != nil {
		return err
	}
	enc := json.NewEncoder(sio.out)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(out); err != nil {
		return fmt.Errorf("write output: %w", err)
	}
	return nil
}
