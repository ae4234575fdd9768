// Package request is an OpenAI-compatible request body as the router reads
// it, parsed once: Parse decodes and validates a body of one Kind
// (completions, chat completions, Responses) into a Parsed, which holds
// the fields routing needs (model, stream, prompt text or token ids,
// cache_salt, output budget), the text prefix_chars routes by
// (RoutingText), the chat's media items (Media), the decoded chat for the
// tokenizer (ChatRequest) and the body to forward (ForwardBody). The
// body itself is forwarded unchanged but for the vllm_xargs merge.
//
// Validation answers what vLLM answers for the fields the router reads
// (field names, types, shapes; bodies that are not UTF-8 or repeat a key
// are refused, since encoding/json and Python's json would read them
// differently). A refused body is an *Error: a Type from a small
// vocabulary (InvalidRequest) that each front maps to its own answer (the
// HTTP front: a 400 in OpenAI's error JSON), the offending field, and a
// client-facing message.
//
// Units: token counts are tokens; image sizes are pixels. The package
// makes no network calls and starts no goroutines; it holds no state
// between requests. A Parsed belongs to one request and is not safe for
// concurrent use.
package request
