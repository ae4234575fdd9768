package tokenizer

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"maps"
	"math"
	"math/bits"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/ardanlabs/jinja"
)

// normalizeMessages returns msgs with vLLM's parse_chat_messages changes:
// content flattened or wrapped per the content format, "reasoning"
// mirrored to "reasoning_content", empty tool_calls dropped and tool-call
// arguments given as JSON strings parsed into objects (vLLM
// _postprocess_messages). Other keys pass through in their order, as
// transformers passes them. msgs is not modified: each message, and each
// tool call and function it changes, is copied (a Document's values are
// read by the router too, and may be rendered again). Integers beyond
// int64 in arguments go through ints (see bigint.go).
func normalizeMessages(msgs *jinja.List, format ContentFormat, ints *bigInts) (jinja.Value, error) {
	out := make([]jinja.Value, len(msgs.Items))
	for i, m := range msgs.Items {
		if !m.IsDict() {
			return jinja.Undefined(), fmt.Errorf("%w: messages[%d]: want an object", ErrBadChat, i)
		}
		var d *jinja.Dict
		out[i], d = cloneDict(m.AsDict())
		role, ok := d.Get("role")
		if !ok || !role.IsString() {
			return jinja.Undefined(), fmt.Errorf("%w: messages[%d].role: want a string", ErrBadChat, i)
		}
		content, err := normalizeContent(d.Data["content"], format)
		if err != nil {
			return jinja.Undefined(), fmt.Errorf("messages[%d].content: %w", i, err)
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
		items := make([]jinja.Value, calls.AsList().Len())
		for j, call := range calls.AsList().Items {
			if items[j], err = normalizeToolCall(call, ints); err != nil {
				return jinja.Undefined(), fmt.Errorf("messages[%d].tool_calls[%d]: %w", i, j, err)
			}
		}
		d.Set("tool_calls", jinja.NewList(items))
	}
	return jinja.NewList(out), nil
}

// cloneDict returns a copy of d (its values shared), as a value and as
// the dict to change.
func cloneDict(d *jinja.Dict) (jinja.Value, *jinja.Dict) {
	v := jinja.NewDict()
	c := v.AsDict()
	c.Keys = slices.Clone(d.Keys)
	maps.Copy(c.Data, d.Data)
	return v, c
}

// normalizeToolCall returns call with a string function.arguments parsed
// into its JSON value and a missing, null or empty one turned into {}
// (copies of the call and its function; call is not modified). Calls
// without a "function" object (which vLLM rejects) are left for the
// template.
func normalizeToolCall(call jinja.Value, ints *bigInts) (jinja.Value, error) {
	if !call.IsDict() {
		return call, nil
	}
	fn, ok := call.AsDict().Get("function")
	if !ok || !fn.IsDict() {
		return call, nil
	}
	fv, f := cloneDict(fn.AsDict())
	args := f.Data["arguments"]
	switch {
	case !args.IsTruthy():
		f.Set("arguments", jinja.NewDict())
	case args.IsString():
		v, err := decodeJSONValue([]byte(args.AsString()), "function.arguments", ints)
		if err != nil {
			return call, err
		}
		f.Set("arguments", v)
	default:
		return call, nil
	}
	cv, c := cloneDict(call.AsDict())
	c.Set("function", fv)
	return cv, nil
}

// normalizeContent returns a message's content as the template sees it.
func normalizeContent(v jinja.Value, format ContentFormat) (jinja.Value, error) {
	if v.IsString() && format == ContentString {
		return v, nil // as joining its one text gives: the same string
	}
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
// Python's json keeps (1 vs 1.0). Invalid UTF-8 and lone surrogates become
// U+FFFD, as in encoding/json. field names the input in errors. Integers
// beyond int64 go through ints (see bigint.go); with nil ints they are
// ErrUnsupported.
func decodeJSONValue(data []byte, field string, ints *bigInts) (jinja.Value, error) {
	s := jsonScanner{data: data, ints: ints}
	s.space()
	v, err := s.value(0)
	if err == nil {
		if s.space(); s.pos < len(s.data) {
			err = s.fail("trailing data")
		}
	}
	if err != nil {
		return jinja.Undefined(), fmt.Errorf("%s: %w", field, err)
	}
	return v, nil
}

// jsonScanner is a single-pass JSON parser producing jinja values; it
// allocates only the values themselves.
type jsonScanner struct {
	data []byte
	pos  int
	ints *bigInts
	dup  bool // an object had a key twice
	// nonASCII is set when a string held a byte 0x80 or above (the
	// only place such a byte can be in valid JSON).
	nonASCII bool
	// values counts the values read, up to MaxJSONValues.
	values int
}

func (s *jsonScanner) fail(what string) error {
	return fmt.Errorf("%w: %s at offset %d", ErrBadChat, what, s.pos)
}

func (s *jsonScanner) space() {
	for s.pos < len(s.data) {
		switch s.data[s.pos] {
		case ' ', '\t', '\n', '\r':
			s.pos++
		default:
			return
		}
	}
}

// literal consumes word (true, false, null) or fails.
func (s *jsonScanner) literal(word string) bool {
	if !bytes.HasPrefix(s.data[s.pos:], []byte(word)) {
		return false
	}
	s.pos += len(word)
	return true
}

func (s *jsonScanner) value(depth int) (jinja.Value, error) {
	if depth > maxJSONDepth {
		return jinja.Undefined(), s.fail(fmt.Sprintf("nested deeper than %d", maxJSONDepth))
	}
	if s.values++; s.values > MaxJSONValues {
		return jinja.Undefined(), fmt.Errorf("%w at offset %d", ErrTooManyValues, s.pos)
	}
	if s.pos >= len(s.data) {
		return jinja.Undefined(), s.fail("unexpected end")
	}
	switch c := s.data[s.pos]; {
	case c == '{':
		return s.object(depth)
	case c == '[':
		return s.array(depth)
	case c == '"':
		str, err := s.str()
		return jinja.NewString(str), err
	case c == '-' || c >= '0' && c <= '9':
		return s.number()
	case s.literal("true"):
		return jinja.NewBool(true), nil
	case s.literal("false"):
		return jinja.NewBool(false), nil
	case s.literal("null"):
		return jinja.None(), nil
	}
	return jinja.Undefined(), s.fail("unexpected character")
}

func (s *jsonScanner) object(depth int) (jinja.Value, error) {
	obj := jinja.NewDict()
	d := obj.AsDict()
	s.pos++ // {
	s.space()
	if s.pos < len(s.data) && s.data[s.pos] == '}' {
		s.pos++
		return obj, nil
	}
	for {
		if s.pos >= len(s.data) || s.data[s.pos] != '"' {
			return jinja.Undefined(), s.fail("want an object key")
		}
		key, err := s.str()
		if err != nil {
			return jinja.Undefined(), err
		}
		s.space()
		if s.pos >= len(s.data) || s.data[s.pos] != ':' {
			return jinja.Undefined(), s.fail("want ':'")
		}
		s.pos++
		s.space()
		v, err := s.value(depth + 1)
		if err != nil {
			return jinja.Undefined(), err
		}
		if _, ok := d.Data[key]; ok {
			s.dup = true
		}
		d.Set(key, v) // a later duplicate key wins in place, as in Python
		s.space()
		if s.pos < len(s.data) && s.data[s.pos] == ',' {
			s.pos++
			s.space()
			continue
		}
		if s.pos < len(s.data) && s.data[s.pos] == '}' {
			s.pos++
			return obj, nil
		}
		return jinja.Undefined(), s.fail("want ',' or '}'")
	}
}

func (s *jsonScanner) array(depth int) (jinja.Value, error) {
	s.pos++ // [
	s.space()
	items := []jinja.Value{}
	if s.pos < len(s.data) && s.data[s.pos] == ']' {
		s.pos++
		return jinja.NewList(items), nil
	}
	for {
		v, err := s.value(depth + 1)
		if err != nil {
			return jinja.Undefined(), err
		}
		items = append(items, v)
		s.space()
		if s.pos < len(s.data) && s.data[s.pos] == ',' {
			s.pos++
			s.space()
			continue
		}
		if s.pos < len(s.data) && s.data[s.pos] == ']' {
			s.pos++
			return jinja.NewList(items), nil
		}
		return jinja.Undefined(), s.fail("want ',' or ']'")
	}
}

// str reads a JSON string starting at its opening quote.
func (s *jsonScanner) str() (string, error) {
	s.pos++ // "
	start := s.pos
	// Fast path: the string ends at the next '"' and has no escape,
	// control character or non-ASCII byte before it. The quote and
	// backslash are found by bytes.IndexByte (vectorized), the rest is
	// checked eight bytes at a time.
	quote := nextByte(s.data, start, '"')
	bslash := nextByte(s.data[:quote], start, '\\')
	s.pos = start + plainPrefix(s.data[start:bslash])
	if s.pos == quote && quote < len(s.data) {
		s.pos++
		return string(s.data[start:quote]), nil
	}
	// The string is decoded into a builder sized to its raw bytes up to
	// the first quote (its length or more, unless that quote is escaped
	// or it holds invalid UTF-8, when the builder grows), whose buffer
	// becomes the string: one copy of its bytes, into memory that is not
	// cleared first.
	var b strings.Builder
	b.Grow(quote - start)
	b.Write(s.data[start:s.pos])
	for s.pos < len(s.data) {
		c := s.data[s.pos]
		switch {
		case c == '"':
			s.pos++
			return b.String(), nil
		case c < 0x20:
			return "", s.fail("control character in string")
		case c == '\\':
			if err := s.escape(&b); err != nil {
				return "", err
			}
		case c < utf8.RuneSelf:
			// A run of plain ASCII up to the next quote or backslash
			// (each found again once passed: an escape may hold a
			// quote), copied at once.
			if quote < s.pos {
				quote = nextByte(s.data, s.pos, '"')
			}
			if bslash < s.pos {
				bslash = nextByte(s.data[:quote], s.pos, '\\')
			}
			run := s.pos
			s.pos += 1 + plainPrefix(s.data[s.pos+1:min(quote, bslash)])
			b.Write(s.data[run:s.pos])
		default:
			s.nonASCII = true
			r, size := utf8.DecodeRune(s.data[s.pos:])
			b.WriteRune(r) // invalid byte: U+FFFD
			s.pos += size
		}
	}
	return "", s.fail("unterminated string")
}

// nextByte returns the index of the first c in b at or after from, or
// len(b).
func nextByte(b []byte, from int, c byte) int {
	if i := bytes.IndexByte(b[from:], c); i >= 0 {
		return from + i
	}
	return len(b)
}

// plainPrefix returns how many leading bytes of b are neither control
// characters (below 0x20) nor non-ASCII (0x80 and above), eight at a
// time: a byte below 0x20 borrows in w-0x20..., setting its top bit (a
// borrow carried into later bytes only marks bytes after a marked one),
// and one at or above 0x80 has it set already.
func plainPrefix(b []byte) int {
	const lo, hi = 0x0101010101010101, 0x8080808080808080
	n := len(b)
	for len(b) >= 32 { // four words a round; the loops below find the byte
		w, v := binary.LittleEndian.Uint64(b), binary.LittleEndian.Uint64(b[8:16])
		x, y := binary.LittleEndian.Uint64(b[16:24]), binary.LittleEndian.Uint64(b[24:32])
		if ((w-lo*0x20)|w|(v-lo*0x20)|v|(x-lo*0x20)|x|(y-lo*0x20)|y)&hi != 0 {
			break
		}
		b = b[32:]
	}
	for len(b) >= 16 {
		w, v := binary.LittleEndian.Uint64(b), binary.LittleEndian.Uint64(b[8:16])
		if ((w-lo*0x20)|w|(v-lo*0x20)|v)&hi != 0 {
			break
		}
		b = b[16:]
	}
	for len(b) >= 8 {
		w := binary.LittleEndian.Uint64(b)
		if m := ((w - lo*0x20) | w) & hi; m != 0 {
			return n - len(b) + bits.TrailingZeros64(m)/8
		}
		b = b[8:]
	}
	for i, c := range b {
		if c < 0x20 || c >= utf8.RuneSelf {
			return n - len(b) + i
		}
	}
	return n
}

// escape decodes one backslash escape into b.
func (s *jsonScanner) escape(b *strings.Builder) error {
	if s.pos+1 >= len(s.data) {
		return s.fail("unterminated escape")
	}
	c := s.data[s.pos+1]
	s.pos += 2
	switch c {
	case '"', '\\', '/':
		b.WriteByte(c)
	case 'b':
		b.WriteByte('\b')
	case 'f':
		b.WriteByte('\f')
	case 'n':
		b.WriteByte('\n')
	case 'r':
		b.WriteByte('\r')
	case 't':
		b.WriteByte('\t')
	case 'u':
		r, ok := s.hex4()
		if !ok {
			return s.fail("bad \\u escape")
		}
		if utf16.IsSurrogate(r) {
			r2 := unicode.ReplacementChar
			if s.pos+1 < len(s.data) && s.data[s.pos] == '\\' && s.data[s.pos+1] == 'u' {
				save := s.pos
				s.pos += 2
				lo, ok := s.hex4()
				if !ok {
					return s.fail("bad \\u escape")
				}
				if r2 = utf16.DecodeRune(r, lo); r2 == unicode.ReplacementChar {
					s.pos = save // not a pair: the second escape stands alone
				}
			}
			r = r2
		}
		b.WriteRune(r)
	default:
		return s.fail("bad escape")
	}
	return nil
}

func (s *jsonScanner) hex4() (rune, bool) {
	if s.pos+4 > len(s.data) {
		return 0, false
	}
	var r rune
	for _, c := range s.data[s.pos : s.pos+4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	s.pos += 4
	return r, true
}

// number reads -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?.
func (s *jsonScanner) number() (jinja.Value, error) {
	start := s.pos
	digits := func() int {
		n := 0
		for s.pos < len(s.data) && s.data[s.pos] >= '0' && s.data[s.pos] <= '9' {
			s.pos++
			n++
		}
		return n
	}
	if s.data[s.pos] == '-' {
		s.pos++
	}
	if s.pos < len(s.data) && s.data[s.pos] == '0' {
		s.pos++
	} else if digits() == 0 {
		return jinja.Undefined(), s.fail("bad number")
	}
	if s.pos < len(s.data) && s.data[s.pos] == '.' {
		s.pos++
		if digits() == 0 {
			return jinja.Undefined(), s.fail("bad number")
		}
	}
	if s.pos < len(s.data) && (s.data[s.pos] == 'e' || s.data[s.pos] == 'E') {
		s.pos++
		if s.pos < len(s.data) && (s.data[s.pos] == '+' || s.data[s.pos] == '-') {
			s.pos++
		}
		if digits() == 0 {
			return jinja.Undefined(), s.fail("bad number")
		}
	}
	return numberValue(string(s.data[start:s.pos]), s.ints)
}

// numberValue keeps Python's distinction: no '.', 'e' or 'E' is an int,
// of any size (beyond int64 through ints). A float beyond float64's range
// is +-inf, as Python's float() makes it (json.loads("1e400") is inf;
// tojson prints Infinity, {{ }} inf), and one below its smallest
// subnormal is 0.0, as in Python; s is a valid JSON number.
func numberValue(s string, ints *bigInts) (jinja.Value, error) {
	if !strings.ContainsAny(s, ".eE") {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return ints.value(s)
		}
		ints.small(n)
		return jinja.NewInt(n), nil
	}
	f, err := strconv.ParseFloat(s, 64) // +-Inf with ErrRange on overflow
	if err != nil && !math.IsInf(f, 0) {
		return jinja.Undefined(), fmt.Errorf("%w: number %s: %v", ErrBadChat, s, err)
	}
	return jinja.NewFloat(f), nil
}
