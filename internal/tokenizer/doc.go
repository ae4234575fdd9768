// Package tokenizer encodes text into the exact token ids a Hugging Face
// byte-level BPE tokenizer (Qwen2/2.5/3, Llama-3.x, GPT-2 family) produces,
// reading the model's own tokenizer.json (plain or gzip) and, when present,
// tokenizer_config.json.
//
// The pipeline mirrors Hugging Face tokenizers (the Rust core, 0.23.x):
// added tokens that are not normalized are cut out of the raw text first;
// each remaining piece is normalized (NFC, ...), then normalized added
// tokens are cut out; the rest is pre-tokenized (Split with the model's
// regex, ByteLevel, Sequence), each pre-token is merged by BPE rank, and the
// post-processor (TemplateProcessing, ByteLevel, RobertaProcessing) adds
// special tokens when asked. Decode maps ids back through the ByteLevel
// decoder. Units: ids are uint32 vocabulary indices; text is UTF-8 (invalid
// bytes in the input are replaced by U+FFFD before encoding, one per byte).
//
// Any tokenizer.json component this package does not implement is a load
// error that names the component; nothing is approximated silently. Known
// divergences from Hugging Face are listed in docs/tokenizer.md and pinned
// by tests.
//
// Chat requests are rendered with the model's chat_template the way
// transformers' apply_chat_template does (ChatTemplate, Local.EncodeChat).
// For models whose files cannot be loaded, Remote asks the engine for the
// exact ids (POST /v1/*/render, falling back to /tokenize). Probe compares
// local and engine tokenization on a fixed probe and reacts to a mismatch;
// Source is what the router calls: local ids, or the engine's when the probe
// has switched it or the local renderer cannot reproduce a request.
//
// A *Tokenizer is immutable after Load/Parse apart from an internal bounded
// word cache guarded by locks, so it is safe for concurrent use by many
// goroutines. The package keeps no package-level mutable state; the only
// goroutine-owning method is Probe.Run, which returns when its ctx ends.
package tokenizer
