package request

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"mime"
	"strings"
	"unicode/utf8"

	"github.com/ardanlabs/jinja"

	"kvrouter/internal/routing"
	"kvrouter/internal/tokenizer"
)

// Kind is which OpenAI endpoint a request body is for.
type Kind uint8

// The kinds of body, by endpoint.
const (
	Completion Kind = iota // POST /v1/completions: "prompt"
	Chat                   // POST /v1/chat/completions: "messages"
	Responses              // POST /v1/responses: "input" (responses.go)
)

// Path is the endpoint's path, on the router and on the engine.
func (k Kind) Path() string {
	if k == Responses {
		return "/v1/responses"
	}
	if k == Chat {
		return "/v1/chat/completions"
	}
	return "/v1/completions"
}

// Parsed is the part of an OpenAI request body the router reads; the body
// itself is forwarded unchanged but for the vllm_xargs merge (ForwardBody).
// A Parsed is not safe for concurrent use (RoutingText caches).
type Parsed struct {
	// Kind is the endpoint the body was parsed for.
	Kind Kind
	// Body is the body as received.
	Body []byte
	// Model is the model the body names.
	Model string
	// Stream is the body's "stream".
	Stream bool
	// messages are the chat messages, validated: objects with a string role.
	messages []json.RawMessage
	// PromptText is a completion's string prompt (the first one of a batch).
	PromptText string
	// PromptTokens are a completion's token-id prompt (the first one of a
	// batch); nil for text prompts.
	PromptTokens []uint32
	hasPrompt    bool
	// CacheSalt is vLLM's cache_salt, "" when absent.
	CacheSalt string
	// xargs is the raw vllm_xargs object, nil when absent.
	xargs json.RawMessage
	// MaxTokens is max_tokens or max_completion_tokens, in tokens, 0 when
	// absent.
	MaxTokens int
	// OutputTokens is the output budget vLLM checks the context length
	// with, in tokens (renderers/params.py
	// TokenizeParams.max_output_tokens, built by the requests'
	// build_tok_params): a chat's max_completion_tokens when given, else
	// its max_tokens; a completion's max_tokens (max_completion_tokens is
	// no completions field); 0 when absent.
	OutputTokens int
	// Responses holds a Responses request's own fields (nil for other
	// kinds).
	Responses *ResponsesFields
	// doc is a chat body decoded once (chatdoc.go), nil when it was read
	// the encoding/json way; msgVals are then its checked messages.
	doc     *tokenizer.Document
	msgVals []jinja.Value
	// text caches RoutingText; textDone tells it was built.
	text     string
	textDone bool
}

// CheckContentType accepts what vLLM (FastAPI) reads as JSON: no
// Content-Type (ct ""), application/json, or application/*+json. Anything
// else (text/plain, curl -d's form type) is an InvalidRequest, as vLLM
// answers it.
func CheckContentType(ct string) *Error {
	if ct == "" {
		return nil
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err == nil && (mt == "application/json" || strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json")) {
		return nil
	}
	return Invalid("", fmt.Sprintf("Content-Type %q: the body must be JSON (Content-Type: application/json)", ct))
}

// CheckContentEncoding accepts a body sent as is: no Content-Encoding (ce
// "") or "identity". vLLM's server (uvicorn and FastAPI) does not
// decompress request bodies, so a compressed one is an InvalidRequest
// naming the encoding rather than a JSON error about its bytes.
func CheckContentEncoding(ce string) *Error {
	if ce == "" || strings.EqualFold(strings.TrimSpace(ce), "identity") {
		return nil
	}
	return Invalid("", fmt.Sprintf("Content-Encoding %q: the body must be sent uncompressed", ce[:min(len(ce), 64)]))
}

// Sniff tells the kind of a body sent to an endpoint that takes all of
// them (the router's POST /v1/route): a chat when it has "messages", a
// Responses body when it has "input" and no "prompt", else a completion.
// It does not validate: Parse does.
func Sniff(body []byte) Kind {
	var probe struct {
		Messages json.RawMessage `json:"messages"`
		Prompt   json.RawMessage `json:"prompt"`
		Input    json.RawMessage `json:"input"`
	}
	k := Completion
	if json.Unmarshal(body, &probe) == nil && !isNull(probe.Messages) {
		k = Chat
	} else if isNull(probe.Prompt) && !isNull(probe.Input) {
		k = Responses
	}
	return k
}

// wire is the decoding target: every field the router checks, kept raw so
// that wrong types are reported as 400s naming the field.
type wire struct {
	Model     json.RawMessage `json:"model"`
	Stream    json.RawMessage `json:"stream"`
	Messages  json.RawMessage `json:"messages"`
	Prompt    json.RawMessage `json:"prompt"`
	CacheSalt json.RawMessage `json:"cache_salt"`
	VLLMXArgs json.RawMessage `json:"vllm_xargs"`
	MaxTokens json.RawMessage `json:"max_tokens"`
	MaxCompl  json.RawMessage `json:"max_completion_tokens"`
}

// Parse decodes and validates an OpenAI request body of kind k. Errors
// are InvalidRequest, naming the offending field in Param; with an error,
// the request is nil, or holds only the model name when the error came
// after it was read (for the request's log line and metrics).
func Parse(k Kind, body []byte) (*Parsed, *Error) {
	// Python's json.loads reads bytes starting with a UTF-8 byte order
	// mark as UTF-8 (json.detect_encoding), so vLLM accepts such a body.
	if len(body) >= 3 && string(body[:3]) == "\xef\xbb\xbf" {
		body = body[3:]
	}
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return nil, Invalid("", "request body must be a JSON object")
	}
	if k == Chat {
		// The one-pass decoder checks the body's UTF-8 itself (below).
		if r, e, ok := parseChatDoc(body, trimmed); ok {
			return r, e
		}
	} else if !utf8.Valid(trimmed) {
		return nil, notUTF8()
	}
	return parseRequestJSON(k, body, trimmed)
}

// notUTF8 answers a body that is not valid UTF-8: encoding/json would
// replace its bytes with U+FFFD and route a prompt that is not the one
// sent; Python's json (vLLM) refuses it.
func notUTF8() *Error { return Invalid("", "request body is not valid UTF-8") }

// parseRequestJSON is Parse the encoding/json way, for bodies the
// one-pass chat decoder leaves to it (chatdoc.go) and every other kind.
// trimmed is body without surrounding space, valid UTF-8.
func parseRequestJSON(k Kind, body, trimmed []byte) (*Parsed, *Error) {
	var w wire
	if err := json.Unmarshal(trimmed, &w); err != nil {
		return nil, Invalid("", fmt.Sprintf("malformed JSON: %v", err))
	}
	if d := ambiguousKey(trimmed); d != "" {
		return nil, Invalid("", "ambiguous JSON: "+d)
	}
	r := &Parsed{Kind: k, Body: body}
	if isNull(w.Model) {
		return nil, Invalid("model", "model is required")
	}
	if err := json.Unmarshal(w.Model, &r.Model); err != nil || r.Model == "" {
		return nil, Invalid("model", "model must be a non-empty string")
	}
	if e := r.parseFields(k, &w); e != nil {
		return &Parsed{Model: r.Model}, e
	}
	return r, nil
}

// parseFields reads and checks the fields after the model.
func (r *Parsed) parseFields(k Kind, w *wire) *Error {
	if !isNull(w.Stream) {
		if err := json.Unmarshal(w.Stream, &r.Stream); err != nil {
			return Invalid("stream", "stream must be a boolean")
		}
	}
	if !isNull(w.CacheSalt) {
		if err := json.Unmarshal(w.CacheSalt, &r.CacheSalt); err != nil {
			return Invalid("cache_salt", "cache_salt must be a string")
		}
	}
	if !isNull(w.VLLMXArgs) {
		if bytes.TrimSpace(w.VLLMXArgs)[0] != '{' {
			return Invalid("vllm_xargs", "vllm_xargs must be an object")
		}
		r.xargs = w.VLLMXArgs
	}
	for _, f := range []struct {
		name string
		raw  json.RawMessage
	}{{"max_tokens", w.MaxTokens}, {"max_completion_tokens", w.MaxCompl}} {
		if isNull(f.raw) {
			continue
		}
		// vLLM's int | None, read by pydantic's lax int (laxint.go): 2.0,
		// "2" and true are integers there. vLLM refuses negative ones
		// (SamplingParams: max_tokens must be at least 1).
		n, ok := LaxInt(f.raw)
		if !ok || n < 0 {
			return Invalid(f.name, f.name+" must be a non-negative integer")
		}
		r.MaxTokens = max(r.MaxTokens, n)
		if f.name == "max_tokens" || k == Chat {
			r.OutputTokens = n // a chat's max_completion_tokens, read second, wins
		}
	}
	switch k {
	case Chat:
		if r.doc != nil {
			msgs, _ := r.doc.Get("messages")
			return r.parseMessageValues(msgs.Value)
		}
		if e := r.parseMessages(w.Messages); e != nil {
			return e
		}
	case Completion:
		if e := r.parsePrompt(w.Prompt); e != nil {
			return e
		}
	case Responses:
		return r.parseResponses()
	}
	return nil
}

func isNull(raw json.RawMessage) bool {
	return len(raw) == 0 || string(bytes.TrimSpace(raw)) == "null"
}

// parseMessages checks that messages is a non-empty array of objects with a
// string role and a content that is a string, null, or an array of typed
// parts (text, image_url, ...).
func (r *Parsed) parseMessages(raw json.RawMessage) *Error {
	if isNull(raw) {
		return Invalid("messages", "messages is required")
	}
	if err := json.Unmarshal(raw, &r.messages); err != nil {
		return Invalid("messages", "messages must be an array of message objects")
	}
	if len(r.messages) == 0 {
		return Invalid("messages", "messages must not be empty")
	}
	for i, m := range r.messages {
		var msg struct {
			Role    json.RawMessage `json:"role"`
			Content json.RawMessage `json:"content"`
		}
		param := fmt.Sprintf("messages[%d]", i)
		if bytes.TrimSpace(m)[0] != '{' || json.Unmarshal(m, &msg) != nil {
			return Invalid(param, param+" must be an object")
		}
		var role string
		if json.Unmarshal(msg.Role, &role) != nil || role == "" {
			return Invalid(param+".role", param+".role must be a non-empty string")
		}
		if isNull(msg.Content) {
			continue
		}
		switch bytes.TrimSpace(msg.Content)[0] {
		case '"':
		case '[':
			var parts []struct {
				Type *string `json:"type"`
			}
			if json.Unmarshal(msg.Content, &parts) != nil {
				return Invalid(param+".content", param+".content must be a string or an array of content parts")
			}
			for j, p := range parts {
				if p.Type == nil {
					return Invalid(fmt.Sprintf("%s.content[%d].type", param, j), "content part type is required")
				}
			}
		default:
			return Invalid(param+".content", param+".content must be a string or an array of content parts")
		}
	}
	return nil
}

// parsePrompt accepts vLLM's prompt shapes: a string, an array of strings,
// an array of token ids, or an array of token-id arrays. The router routes a
// batch by its first prompt.
func (r *Parsed) parsePrompt(raw json.RawMessage) *Error {
	const msg = "prompt must be a string, an array of strings, an array of token ids or an array of token-id arrays"
	if isNull(raw) {
		return Invalid("prompt", "prompt is required")
	}
	raw = bytes.TrimSpace(raw)
	r.hasPrompt = true
	switch raw[0] {
	case '"':
		if json.Unmarshal(raw, &r.PromptText) != nil {
			return Invalid("prompt", msg)
		}
		return nil
	case '[':
	default:
		return Invalid("prompt", msg)
	}
	// raw is valid JSON (the whole body decoded): the first element's
	// first byte tells the prompt's form, without decoding every element.
	first := bytes.TrimLeft(raw[1:], " \t\r\n")
	if len(first) == 0 || first[0] == ']' {
		return Invalid("prompt", "prompt must not be empty")
	}
	switch first[0] {
	case '"':
		var ss []string
		if json.Unmarshal(raw, &ss) != nil {
			return Invalid("prompt", msg)
		}
		r.PromptText = ss[0]
	case '[':
		var tt [][]float64
		if json.Unmarshal(raw, &tt) != nil {
			return Invalid("prompt", msg)
		}
		for i, t := range tt {
			ids, ok := tokenIDs(t)
			if !ok || len(ids) == 0 {
				return Invalid(fmt.Sprintf("prompt[%d]", i), "token ids must be non-negative integers < 2^32, at least one")
			}
			if i == 0 {
				r.PromptTokens = ids
			}
		}
	default:
		if ids, ok := appendIntArray(nil, raw); ok && len(ids) > 0 {
			r.PromptTokens = ids
			return nil
		}
		var t []float64
		if json.Unmarshal(raw, &t) != nil {
			return Invalid("prompt", msg)
		}
		ids, ok := tokenIDs(t)
		if !ok {
			return Invalid("prompt", "token ids must be non-negative integers < 2^32")
		}
		r.PromptTokens = ids
	}
	return nil
}

// RoutingText is the prompt text prefix_chars routes by, built as
// production-stack's PrefixAwareRouter builds it (routing.PrefixChars cites
// the source): a completion's string prompt (the first of a batch;
// production-stack fails on a list), a token-id prompt as
// routing.TokenText, and for chat every message's content joined by "\n":
// a string as is, a list of parts as the "text" of its parts of type
// "text" joined by " ", an absent content as "", a null one left out.
// Built once per request, when the router uses it.
func (r *Parsed) RoutingText() string {
	if r.textDone {
		return r.text
	}
	r.textDone = true
	switch {
	case r.msgVals != nil:
		r.text = chatTextValues(r.msgVals)
	case r.Kind == Chat || r.Kind == Responses:
		r.text = chatText(r.messages)
	case r.PromptTokens != nil:
		r.text = routing.TokenText(r.PromptTokens)
	default:
		r.text = r.PromptText
	}
	return r.text
}

// chatText joins messages' contents as production-stack does. messages
// passed parseMessages; a part's "text" that is not a string (vLLM rejects
// the request; production-stack fails on it) counts as "".
func chatText(messages []json.RawMessage) string {
	var b strings.Builder
	first := true
	for _, m := range messages {
		var msg struct {
			Content json.RawMessage `json:"content"`
		}
		_ = json.Unmarshal(m, &msg) // checked by parseMessages
		if string(msg.Content) == "null" {
			continue
		}
		if !first {
			b.WriteByte('\n')
		}
		first = false
		c := bytes.TrimSpace(msg.Content)
		if len(c) == 0 {
			continue // absent: ""
		}
		if c[0] == '"' {
			var s string
			_ = json.Unmarshal(c, &s)
			b.WriteString(s)
			continue
		}
		var parts []struct {
			Type string          `json:"type"`
			Text json.RawMessage `json:"text"`
		}
		_ = json.Unmarshal(c, &parts)
		sep := false
		for _, p := range parts {
			if p.Type != "text" {
				continue
			}
			if sep {
				b.WriteByte(' ')
			}
			sep = true
			var s string
			if json.Unmarshal(p.Text, &s) == nil {
				b.WriteString(s)
			}
		}
	}
	return b.String()
}

func tokenIDs(fs []float64) ([]uint32, bool) {
	ids := make([]uint32, len(fs))
	for i, f := range fs {
		if f < 0 || f > math.MaxUint32 || f != math.Trunc(f) {
			return nil, false
		}
		ids[i] = uint32(f)
	}
	return ids, true
}

// appendIntArray appends the values of raw, a JSON array of plain decimal
// integers in [0, 2^32) (no sign, fraction or exponent), to ids. ok is
// false for anything else, which the caller then decodes with
// encoding/json (same result, 10x slower on a 512-id prompt).
func appendIntArray(ids []uint32, raw []byte) (_ []uint32, ok bool) {
	i, n := 0, len(raw)
	ws := func() {
		for i < n && (raw[i] == ' ' || raw[i] == '\t' || raw[i] == '\r' || raw[i] == '\n') {
			i++
		}
	}
	ws()
	if i == n || raw[i] != '[' {
		return ids, false
	}
	i++
	ws()
	if i < n && raw[i] == ']' {
		i++
		ws()
		return ids, i == n
	}
	for {
		start := i
		var v uint64
		for i < n && raw[i] >= '0' && raw[i] <= '9' && i-start < 11 {
			v = v*10 + uint64(raw[i]-'0')
			i++
		}
		if i == start || i-start > 10 || v > math.MaxUint32 || raw[start] == '0' && i-start > 1 {
			return ids, false
		}
		ids = append(ids, uint32(v))
		ws()
		if i == n {
			return ids, false
		}
		switch raw[i] {
		case ',':
			i++
			ws()
		case ']':
			i++
			ws()
			return ids, i == n
		default:
			return ids, false
		}
	}
}

// hitReportXArgs is merged into vllm_xargs so that the engine reports the
// prefix blocks it reused as KV events (vLLM >= 2026-07).
const hitReportKey = "kv_cache_report_mode"

// ForwardBody returns the body to send upstream: with
// vllm_xargs.kv_cache_report_mode = "full" merged in when inject is set and
// the client did not choose a mode itself, else the body unchanged.
func (r *Parsed) ForwardBody(inject bool) ([]byte, error) {
	if !inject {
		return r.Body, nil
	}
	if r.xargs == nil {
		// Common case: splice before the closing brace, no re-encoding.
		b := bytes.TrimRight(r.Body, " \t\r\n")
		if len(b) == 0 || b[len(b)-1] != '}' {
			return nil, fmt.Errorf("body does not end with '}'")
		}
		// bytes.Join allocates exactly and does not clear what it copies
		// over (a make and append would clear the 100s of KB first).
		return bytes.Join([][]byte{b[:len(b)-1], []byte(`,"vllm_xargs":{"` + hitReportKey + `":"full"}}`)}, nil), nil
	}
	var xargs map[string]json.RawMessage
	if err := json.Unmarshal(r.xargs, &xargs); err != nil {
		return nil, fmt.Errorf("vllm_xargs: %w", err)
	}
	if _, ok := xargs[hitReportKey]; ok {
		return r.Body, nil
	}
	xargs[hitReportKey] = json.RawMessage(`"full"`)
	var top map[string]json.RawMessage
	if err := json.Unmarshal(r.Body, &top); err != nil {
		return nil, fmt.Errorf("body: %w", err)
	}
	nx, err := json.Marshal(xargs)
	if err != nil {
		return nil, fmt.Errorf("vllm_xargs: %w", err)
	}
	top["vllm_xargs"] = nx
	return json.Marshal(top)
}
