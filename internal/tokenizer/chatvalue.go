package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/ardanlabs/jinja"
)

// normalizeMessages applies vLLM's parse_chat_messages changes in place:
// content flattened or wrapped per the content format, "reasoning" mirrored
// to "reasoning_content", empty tool_calls dropped and tool-call arguments
// given as JSON strings parsed into objects (vLLM _postprocess_messages).
// Other keys pass through in their order, as transformers passes them.
func normalizeMessages(msgs *jinja.List, format ContentFormat) error {
	for i, m := range msgs.Items {
		if !m.IsDict() {
			return fmt.Errorf("%w: messages[%d]: want an object", ErrBadChat, i)
		}
		d := m.AsDict()
		role, ok := d.Get("role")
		if !ok || !role.IsString() {
			return fmt.Errorf("%w: messages[%d].role: want a string", ErrBadChat, i)
		}
		content, err := normalizeContent(d.Data["content"], format)
		if err != nil {
			return fmt.Errorf("messages[%d].content: %w", i, err)
		}
		d.Set("content", content)
		if role.AsString() != "assistant" {
			continue
		}
		if r, ok := d.Get("reasoning"); ok && r.IsString() && !d.Has("reasoning_content") {
			d.Set("reasoning_content", r)
		}
		calls, ok := d.Get("tool_calls")
		if !ok || !calls.IsList() {
			continue
		}
		if calls.AsList().Len() == 0 {
			deleteKey(d, "tool_calls")
			continue
		}
		for j, call := range calls.AsList().Items {
			if err := normalizeToolCall(call); err != nil {
				return fmt.Errorf("messages[%d].tool_calls[%d]: %w", i, j, err)
			}
		}
	}
	return nil
}

// normalizeToolCall parses a string function.arguments into its JSON value
// and turns a missing, null or empty one into {}. Calls without a
// "function" object (which vLLM rejects) are left for the template.
func normalizeToolCall(call jinja.Value) error {
	if !call.IsDict() {
		return nil
	}
	fn, ok := call.AsDict().Get("function")
	if !ok || !fn.IsDict() {
		return nil
	}
	f := fn.AsDict()
	args := f.Data["arguments"]
	switch {
	case !args.IsTruthy():
		f.Set("arguments", jinja.NewDict())
	case args.IsString():
		v, err := decodeJSONValue([]byte(args.AsString()), "function.arguments")
		if err != nil {
			return err
		}
		f.Set("arguments", v)
	}
	return nil
}

// normalizeContent returns a message's content as the template sees it.
func normalizeContent(v jinja.Value, format ContentFormat) (jinja.Value, error) {
	var texts []string
	switch {
	case v.IsUndefined() || v.IsNone():
	case v.IsString():
		texts = []string{v.AsString()}
	case v.IsList():
		for i, p := range v.AsList().Items {
			t, ok, err := partText(p)
			if err != nil {
				return v, fmt.Errorf("part %d: %w", i, err)
			}
			if ok {
				texts = append(texts, t)
			}
		}
	default:
		return v, fmt.Errorf("%w: want a string, a list of parts or null", ErrBadChat)
	}
	if format == ContentString {
		return jinja.NewString(strings.Join(texts, "\n")), nil
	}
	parts := make([]jinja.Value, len(texts))
	for i, t := range texts {
		d := jinja.NewDict()
		d.AsDict().Set("type", jinja.NewString("text"))
		d.AsDict().Set("text", jinja.NewString(t))
		parts[i] = d
	}
	return jinja.NewList(parts), nil
}

// partText extracts the text of one content part; ok is false for a text
// part whose text is null (vLLM skips those). Non-text parts are
// ErrUnsupported: their placeholders and ids come from the engine.
func partText(p jinja.Value) (text string, ok bool, err error) {
	if p.IsString() {
		return p.AsString(), true, nil
	}
	if !p.IsDict() {
		return "", false, fmt.Errorf("%w: want an object", ErrBadChat)
	}
	d := p.AsDict()
	typ, _ := d.Get("type")
	key := "text"
	switch {
	case !typ.IsString():
		return "", false, fmt.Errorf("%w: content part without a type", ErrUnsupported)
	case typ.AsString() == "refusal":
		key = "refusal"
	case typ.AsString() == "thinking":
		key = "thinking"
	case typ.AsString() == "text", typ.AsString() == "input_text", typ.AsString() == "output_text":
	default:
		return "", false, fmt.Errorf("%w: content part of type %q", ErrUnsupported, typ.AsString())
	}
	t, _ := d.Get(key)
	switch {
	case t.IsUndefined() || t.IsNone():
		return "", false, nil
	case t.IsString():
		return t.AsString(), true, nil
	}
	return "", false, fmt.Errorf("%w: %s: want a string", ErrBadChat, key)
}

// deleteKey removes key from d, keeping the order of the others.
func deleteKey(d *jinja.Dict, key string) {
	if _, ok := d.Data[key]; !ok {
		return
	}
	delete(d.Data, key)
	for i, k := range d.Keys {
		if k == key {
			d.Keys = append(d.Keys[:i:i], d.Keys[i+1:]...)
			break
		}
	}
}

// maxJSONDepth bounds nesting so hostile input cannot recurse without end
// (Python's json gives up near 1000 levels too).
const maxJSONDepth = 512

// decodeJSONValue decodes one JSON document into template values, keeping
// object key order (the order tojson prints) and the int/float distinction
// Python's json keeps (1 vs 1.0). field names the input in errors.
func decodeJSONValue(data []byte, field string) (jinja.Value, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	v, err := decodeValue(dec, 0)
	if err == nil {
		if _, e := dec.Token(); e != io.EOF {
			err = fmt.Errorf("%w: trailing data", ErrBadChat)
		}
	}
	if err != nil {
		if !errors.Is(err, ErrBadChat) && !errors.Is(err, ErrUnsupported) {
			err = fmt.Errorf("%w: %v", ErrBadChat, err)
		}
		return jinja.Undefined(), fmt.Errorf("%s: %w", field, err)
	}
	return v, nil
}

func decodeValue(dec *json.Decoder, depth int) (jinja.Value, error) {
	if depth > maxJSONDepth {
		return jinja.Undefined(), fmt.Errorf("%w: nested deeper than %d", ErrBadChat, maxJSONDepth)
	}
	tok, err := dec.Token()
	if err != nil {
		return jinja.Undefined(), err
	}
	switch t := tok.(type) {
	case nil:
		return jinja.None(), nil
	case bool:
		return jinja.NewBool(t), nil
	case string:
		return jinja.NewString(t), nil
	case json.Number:
		return numberValue(string(t))
	case json.Delim:
		if t == '[' {
			items := []jinja.Value{}
			for dec.More() {
				v, err := decodeValue(dec, depth+1)
				if err != nil {
					return jinja.Undefined(), err
				}
				items = append(items, v)
			}
			_, err := dec.Token()
			return jinja.NewList(items), err
		}
		obj := jinja.NewDict()
		d := obj.AsDict()
		for dec.More() {
			k, err := dec.Token()
			if err != nil {
				return jinja.Undefined(), err
			}
			v, err := decodeValue(dec, depth+1)
			if err != nil {
				return jinja.Undefined(), err
			}
			d.Set(k.(string), v) // a later duplicate key wins in place, as in Python
		}
		_, err := dec.Token()
		return obj, err
	}
	return jinja.Undefined(), fmt.Errorf("%w: unexpected token %v", ErrBadChat, tok)
}

// numberValue keeps Python's distinction: no '.', 'e' or 'E' is an int.
func numberValue(s string) (jinja.Value, error) {
	if !strings.ContainsAny(s, ".eE") {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return jinja.Undefined(), fmt.Errorf("%w: integer %s beyond int64", ErrUnsupported, s)
		}
		return jinja.NewInt(n), nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		// Python's json.loads turns overflowing floats into inf; tojson
		// would print Infinity. Rare enough to leave to the engine.
		return jinja.Undefined(), fmt.Errorf("%w: number %s out of float64 range", ErrUnsupported, s)
	}
	return jinja.NewFloat(f), nil
}
