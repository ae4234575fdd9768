// Package kvrouter embeds the reference data that the demo and the simulator
// use by default, so that the binary runs with no files beside it.
package kvrouter

import "embed"

// Assets holds, read-only:
//   - testdata/mooncake/conversation_trace.jsonl.gz: the Mooncake FAST'25
//     conversation trace (12,031 requests, Apache-2.0);
//   - testdata/tokenizer/qwen3/: the Qwen3 tokenizer.json.gz and
//     tokenizer_config.json (Apache-2.0).
//
//go:embed testdata/mooncake/conversation_trace.jsonl.gz testdata/tokenizer/qwen3/tokenizer.json.gz testdata/tokenizer/qwen3/tokenizer_config.json
var Assets embed.FS
