package tokenizer

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/ardanlabs/jinja"
)

// Document is a JSON request body decoded in one pass: its top-level
// fields in order, each with its raw JSON (a subslice of the body, not a
// copy) and its value as the chat template sees values (object key order
// kept, 1 and 1.0 told apart). A caller reads routing fields from it and
// hands ChatRequest to the renderer, so no stage decodes the body again.
// A Document is not safe for concurrent use while a ChatRequest made from
// it renders.
type Document struct {
	// Fields are the body's top-level fields in their order.
	Fields []Field
	// Duplicate is set when some object of the body, at any depth, has a
	// key twice (the value then holds the later one, as Python's json).
	Duplicate bool
	// ASCII is set when every byte of the body is ASCII (below 0x80), so
	// that it is valid UTF-8 without another pass over it. A body with
	// other bytes decodes too (invalid UTF-8 becomes U+FFFD), with ASCII
	// false.
	ASCII bool
	// ints collects the integers beyond int64 of the fields the chat
	// template reads (messages, tools, chat_template_kwargs).
	ints *bigInts
}

// Field is one top-level field of a Document.
type Field struct {
	Key string
	// Raw is the field's JSON value, a subslice of the decoded body.
	Raw []byte
	// Value is Raw decoded.
	Value jinja.Value
}

// errNotObject marks a body that is not a JSON object.
var errNotObject = errors.New("not a JSON object")

// templateField reports whether key is a top-level field that reaches the
// chat template (messages, tools, chat_template_kwargs). Their integers
// beyond int64 are carried to the template (bigint.go).
func templateField(key string) bool {
	return key == "messages" || key == "tools" || key == "chat_template_kwargs"
}

// DecodeDocument decodes body, which must hold one JSON object, in a
// single pass. Errors wrap ErrBadChat (malformed JSON, nesting deeper than
// 512 levels) or ErrUnsupported (an integer of more digits than Python
// accepts); a caller needing encoding/json's wording for them decodes the
// body with it then.
func DecodeDocument(body []byte) (*Document, error) {
	doc := &Document{ints: &bigInts{}}
	s := jsonScanner{data: body}
	s.space()
	if s.pos >= len(s.data) || s.data[s.pos] != '{' {
		return nil, fmt.Errorf("%w: %w", ErrBadChat, errNotObject)
	}
	s.pos++
	s.space()
	// A later duplicate of a key replaces the earlier field, which is
	// marked (Raw nil) and dropped at the end; past smallObject fields
	// index finds earlier keys, so that many keys cost time in proportion
	// to their number, not its square.
	var index map[string]int
	dup := false
	if s.pos < len(s.data) && s.data[s.pos] == '}' {
		s.pos++
	} else {
		for {
			if s.pos >= len(s.data) || s.data[s.pos] != '"' {
				return nil, s.fail("want an object key")
			}
			key, err := s.str()
			if err != nil {
				return nil, err
			}
			s.space()
			if s.pos >= len(s.data) || s.data[s.pos] != ':' {
				return nil, s.fail("want ':'")
			}
			s.pos++
			s.space()
			s.ints = &bigInts{}
			if templateField(key) {
				s.ints = doc.ints
			}
			start := s.pos
			v, err := s.value(1)
			if err != nil {
				return nil, err
			}
			earlier, found := -1, false
			if index != nil {
				earlier, found = index[key]
			} else {
				for i := range doc.Fields {
					if doc.Fields[i].Raw != nil && doc.Fields[i].Key == key {
						earlier, found = i, true
						break
					}
				}
			}
			if found {
				dup = true
				doc.Fields[earlier].Raw = nil
			}
			doc.Fields = append(doc.Fields, Field{Key: key, Raw: body[start:s.pos], Value: v})
			switch {
			case index != nil:
				index[key] = len(doc.Fields) - 1
			case len(doc.Fields) > smallObject:
				index = make(map[string]int, 2*len(doc.Fields))
				for i, f := range doc.Fields {
					if f.Raw != nil {
						index[f.Key] = i
					}
				}
			}
			s.space()
			if s.pos < len(s.data) && s.data[s.pos] == ',' {
				s.pos++
				s.space()
				continue
			}
			if s.pos < len(s.data) && s.data[s.pos] == '}' {
				s.pos++
				break
			}
			return nil, s.fail("want ',' or '}'")
		}
	}
	if s.space(); s.pos < len(s.data) {
		return nil, s.fail("trailing data")
	}
	if dup {
		doc.Fields = slices.DeleteFunc(doc.Fields, func(f Field) bool { return f.Raw == nil })
	}
	doc.Duplicate = dup || s.dup
	doc.ASCII = !s.nonASCII
	return doc, nil
}

// smallObject is the most top-level fields DecodeDocument searches one by
// one for an earlier field of the same key.
const smallObject = 16

// Get returns the top-level field key (matched exactly).
func (d *Document) Get(key string) (Field, bool) {
	for _, f := range d.Fields {
		if f.Key == key {
			return f, true
		}
	}
	return Field{}, false
}

// errNotDecodedAlike marks a Document whose ChatRequest encoding/json
// could read differently (a key differing from a chat field only in case,
// which encoding/json matches and vLLM does not).
var errNotDecodedAlike = errors.New("a chat request field given in another case")

// chatFields are the fields of ChatRequest's JSON form.
var chatFields = []string{"messages", "tools", "add_generation_prompt", "chat_template_kwargs", "continue_final_message", "chat_template"}

// ChatRequest returns the chat request d holds, as ChatRequest's
// UnmarshalJSON reads it from the same body (add_generation_prompt true
// unless given), carrying d's decoded messages, tools and
// chat_template_kwargs to the renderer. It fails (wrapping ErrBadChat)
// where UnmarshalJSON might read the body otherwise or fail: a field of
// the wrong JSON type, or a key differing from a field only in case; the
// caller then decodes the body with UnmarshalJSON for its exact answer.
func (d *Document) ChatRequest() (ChatRequest, error) {
	r := ChatRequest{AddGenerationPrompt: true, pre: &preDecoded{ints: d.ints}}
	for _, f := range d.Fields {
		for _, name := range chatFields {
			if f.Key != name && strings.EqualFold(f.Key, name) {
				return ChatRequest{}, fmt.Errorf("%w: %w: %q", ErrBadChat, errNotDecodedAlike, f.Key)
			}
		}
		v := f.Value
		wrong := func() error {
			return fmt.Errorf("%w: %s: wrong JSON type", ErrBadChat, f.Key)
		}
		switch f.Key {
		case "messages":
			r.Messages, r.pre.messages = f.Raw, v
		case "tools":
			r.Tools, r.pre.tools = f.Raw, v
		case "chat_template_kwargs":
			r.ChatTemplateKwargs, r.pre.kwargs = f.Raw, v
		case "add_generation_prompt", "continue_final_message":
			if v.IsNone() {
				continue
			}
			if !v.IsBool() {
				return ChatRequest{}, wrong()
			}
			if f.Key == "add_generation_prompt" {
				r.AddGenerationPrompt = v.AsBool()
			} else {
				r.ContinueFinalMessage = v.AsBool()
			}
		case "chat_template":
			if v.IsNone() {
				continue
			}
			if !v.IsString() {
				return ChatRequest{}, wrong()
			}
			r.ChatTemplate = v.AsString()
		}
	}
	if r.Messages == nil {
		r.pre.messages = jinja.Undefined()
	}
	return r, nil
}

// preDecoded are a ChatRequest's messages, tools and chat_template_kwargs
// already decoded (Document.ChatRequest), with the integers beyond int64
// they hold. The renderer reads them instead of decoding the raw fields;
// it never modifies them (normalizeMessages copies what it changes).
type preDecoded struct {
	messages, tools, kwargs jinja.Value
	ints                    *bigInts
}

// decoded returns the value of a raw chat field: pre's when set (the zero
// Value, Undefined, is never set for a present field), else raw decoded.
func decoded(pre jinja.Value, raw []byte, field string, ints *bigInts) (jinja.Value, error) {
	if !pre.IsUndefined() {
		return pre, nil
	}
	return decodeJSONValue(raw, field, ints)
}
