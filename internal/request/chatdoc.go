package request

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/ardanlabs/jinja"

	"kvrouter/internal/tokenizer"
	"kvrouter/internal/vllm"
)

// A chat body is decoded once (tokenizer.DecodeDocument): the routing
// fields are read from its top-level raw fields, the messages are checked,
// scanned for media and joined for prefix_chars from its values, and the
// chat template renders those same values (TokensChat). Bodies the
// one-pass decoder does not take as encoding/json would (malformed JSON,
// duplicate keys, a known key in another case, which encoding/json
// matches) go the encoding/json way, whose answers (the 400s and what is
// routed) stay the reference.

// caseKeys are the keys the router reads in a chat body's messages and
// parts; a key equal to one of them but for case sends the body the
// encoding/json way.
var caseKeys = []string{"role", "content", "type", "text", "image_url", "url"}

// caseVariant reports whether d has a key that differs only in case from
// one of caseKeys.
func caseVariant(d *jinja.Dict) bool {
	for _, k := range d.Keys {
		for _, ck := range caseKeys {
			if len(k) == len(ck) && k != ck && strings.EqualFold(k, ck) {
				return true
			}
		}
	}
	return false
}

// parseChatDoc is Parse for a chat body through one decode. ok is
// false when the body must be read the encoding/json way (see above); it
// is then valid UTF-8. The decode tells whether the body is all ASCII;
// UTF-8 is checked only when it is not, or the decode failed, before
// any other answer.
func parseChatDoc(body, trimmed []byte) (_ *Parsed, _ *Error, ok bool) {
	doc, err := tokenizer.DecodeDocument(trimmed)
	if (err != nil || !doc.ASCII) && !utf8.Valid(trimmed) {
		return nil, notUTF8(), true
	}
	if errors.Is(err, tokenizer.ErrTooManyValues) {
		// Answered here: the encoding/json way would decode it all again.
		return nil, Invalid("", fmt.Sprintf("request body holds more than %d JSON values", tokenizer.MaxJSONValues)), true
	}
	if err != nil || doc.Duplicate {
		return nil, nil, false
	}
	var w wire
	for _, f := range doc.Fields {
		for _, rk := range routerKeys {
			if len(f.Key) == len(rk) && f.Key != rk && strings.EqualFold(f.Key, rk) {
				return nil, nil, false
			}
		}
		switch f.Key {
		case "model":
			w.Model = f.Raw
		case "stream":
			w.Stream = f.Raw
		case "messages":
			w.Messages = f.Raw
		case "prompt":
			w.Prompt = f.Raw
		case "cache_salt":
			w.CacheSalt = f.Raw
		case "vllm_xargs":
			w.VLLMXArgs = f.Raw
		case "max_tokens":
			w.MaxTokens = f.Raw
		case "max_completion_tokens":
			w.MaxCompl = f.Raw
		}
	}
	msgs, _ := doc.Get("messages")
	if !checkCase(msgs.Value) {
		return nil, nil, false
	}
	r := &Parsed{Kind: Chat, Body: body, doc: doc}
	if isNull(w.Model) {
		return nil, Invalid("model", "model is required"), true
	}
	if m, _ := doc.Get("model"); !m.Value.IsString() || m.Value.AsString() == "" {
		return nil, Invalid("model", "model must be a non-empty string"), true
	} else {
		r.Model = m.Value.AsString()
	}
	if e := r.parseFields(Chat, &w); e != nil {
		return &Parsed{Model: r.Model}, e, true
	}
	return r, nil, true
}

// checkCase reports whether no message, content part or image_url of
// msgs has a key differing only in case from one the router reads.
func checkCase(msgs jinja.Value) bool {
	if !msgs.IsList() {
		return true
	}
	for _, m := range msgs.AsList().Items {
		if !m.IsDict() {
			continue
		}
		if caseVariant(m.AsDict()) {
			return false
		}
		c, _ := m.AsDict().Get("content")
		if !c.IsList() {
			continue
		}
		for _, p := range c.AsList().Items {
			if !p.IsDict() {
				continue
			}
			if caseVariant(p.AsDict()) {
				return false
			}
			if u, ok := p.AsDict().Get("image_url"); ok && u.IsDict() && caseVariant(u.AsDict()) {
				return false
			}
		}
	}
	return true
}

// parseMessageValues is parseMessages over the decoded messages, with the
// same answers.
func (r *Parsed) parseMessageValues(v jinja.Value) *Error {
	if v.IsUndefined() || v.IsNone() {
		return Invalid("messages", "messages is required")
	}
	if !v.IsList() {
		return Invalid("messages", "messages must be an array of message objects")
	}
	items := v.AsList().Items
	if len(items) == 0 {
		return Invalid("messages", "messages must not be empty")
	}
	for i, m := range items {
		param := fmt.Sprintf("messages[%d]", i)
		if !m.IsDict() {
			return Invalid(param, param+" must be an object")
		}
		d := m.AsDict()
		if role, _ := d.Get("role"); !role.IsString() || role.AsString() == "" {
			return Invalid(param+".role", param+".role must be a non-empty string")
		}
		c, _ := d.Get("content")
		switch {
		case c.IsUndefined() || c.IsNone() || c.IsString():
		case c.IsList():
			parts := c.AsList().Items
			for _, p := range parts { // every part decodes as {"type": string or null}
				if !p.IsNone() && !p.IsDict() {
					return Invalid(param+".content", param+".content must be a string or an array of content parts")
				}
				if p.IsDict() {
					if t, ok := p.AsDict().Get("type"); ok && !t.IsNone() && !t.IsString() {
						return Invalid(param+".content", param+".content must be a string or an array of content parts")
					}
				}
			}
			for j, p := range parts {
				t := jinja.None()
				if p.IsDict() {
					t, _ = p.AsDict().Get("type")
				}
				if !t.IsString() {
					return Invalid(fmt.Sprintf("%s.content[%d].type", param, j), "content part type is required")
				}
			}
		default:
			return Invalid(param+".content", param+".content must be a string or an array of content parts")
		}
	}
	r.msgVals = items
	return nil
}

// chatTextValues is chatText over the decoded messages.
func chatTextValues(messages []jinja.Value) string {
	var b strings.Builder
	first := true
	for _, m := range messages {
		c, ok := m.AsDict().Get("content")
		if ok && c.IsNone() {
			continue
		}
		if !first {
			b.WriteByte('\n')
		}
		first = false
		if !ok {
			continue // absent: ""
		}
		if c.IsString() {
			b.WriteString(c.AsString())
			continue
		}
		sep := false
		for _, p := range c.AsList().Items {
			if !p.IsDict() {
				continue // null part: type ""
			}
			if t, _ := p.AsDict().Get("type"); !t.IsString() || t.AsString() != "text" {
				continue
			}
			if sep {
				b.WriteByte(' ')
			}
			sep = true
			if t, _ := p.AsDict().Get("text"); t.IsString() {
				b.WriteString(t.AsString())
			}
		}
	}
	return b.String()
}

// scanMediaValues is Media over the decoded messages: a message whose
// parts encoding/json would not decode (an image_url that is not an
// object, a url that is not a string) is skipped, as there.
func scanMediaValues(messages []jinja.Value) Media {
	var ms Media
	var counts map[string]int
	for _, m := range messages {
		c, _ := m.AsDict().Get("content")
		if !c.IsList() || !mediaPartsDecode(c.AsList().Items) {
			continue
		}
		for _, p := range c.AsList().Items {
			if !p.IsDict() {
				continue
			}
			t, _ := p.AsDict().Get("type")
			if !t.IsString() {
				continue
			}
			mod := mediaModality(t.AsString())
			if mod == "" {
				continue
			}
			if counts == nil {
				counts = map[string]int{}
			}
			counts[mod]++
			if u, ok := p.AsDict().Get("image_url"); ok && u.IsDict() {
				if url, _ := u.AsDict().Get("url"); url.IsString() {
					if w, h, ok := dataURLSize(url.AsString()); ok {
						ms.Pixels += int64(w) * int64(h)
						ms.VisualTokens += vllm.Qwen2VLImageTokens(w, h)
					}
				}
			}
			ms.Items++
		}
	}
	ms.Counts = counts
	return ms
}

// mediaPartsDecode reports whether encoding/json decodes parts into
// Media's part struct (type a string or null, image_url an object or
// null whose url is a string or null).
func mediaPartsDecode(parts []jinja.Value) bool {
	for _, p := range parts {
		if p.IsNone() {
			continue
		}
		if !p.IsDict() {
			return false
		}
		d := p.AsDict()
		if t, ok := d.Get("type"); ok && !t.IsNone() && !t.IsString() {
			return false
		}
		u, ok := d.Get("image_url")
		if !ok || u.IsNone() {
			continue
		}
		if !u.IsDict() {
			return false
		}
		if url, ok := u.AsDict().Get("url"); ok && !url.IsNone() && !url.IsString() {
			return false
		}
	}
	return true
}

// errNoDoc marks a request not decoded as a Document.
var errNoDoc = errors.New("chat body not decoded once")

// ChatRequest is the chat request of a body decoded once, for a
// tokenizer to render without decoding the body again; an error when it
// was not (or holds what the renderer must read the encoding/json way).
func (r *Parsed) ChatRequest() (tokenizer.ChatRequest, error) {
	if r.doc == nil || r.Kind != Chat {
		return tokenizer.ChatRequest{}, errNoDoc
	}
	return r.doc.ChatRequest()
}
