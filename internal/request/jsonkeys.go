package request

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// routerKeys are the top-level request keys the router reads (the fields
// of wire). encoding/json matches object keys to struct fields without
// regard to case, vLLM (pydantic) with it: a body with "Model" would be
// read by the router and ignored by the engine, so such keys are refused.
var routerKeys = []string{"model", "stream", "messages", "prompt", "cache_salt", "vllm_xargs", "max_tokens", "max_completion_tokens"}

// ambiguousKey scans b, a syntactically valid JSON document, for an object
// that has the same key twice (at any depth; keys compared after
// unescaping), or a top-level key that differs only in case from a key
// the router reads. It returns a description naming the key and the JSON
// path of its object, or "" when there is none. Readers disagree on
// duplicates (first or last wins), so a router and an engine could act on
// different values.
func ambiguousKey(b []byte) string {
	s := keyScanner{b: b}
	s.ws()
	return s.value()
}

type keyScanner struct {
	b    []byte
	i    int
	path []step // keys and indexes down to the current value
}

// step is one key (key != nil) or array index of a path.
type step struct {
	key []byte
	idx int
}

func (s *keyScanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\r', '\n':
			s.i++
		default:
			return
		}
	}
}

// str consumes a string at s.i (its opening quote) and returns its raw
// content and whether it has escapes.
func (s *keyScanner) str() (raw []byte, escaped bool) {
	start := s.i + 1
	s.i = start
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case '\\':
			escaped = true
			s.i += 2
		case '"':
			raw = s.b[start:s.i]
			s.i++
			return raw, escaped
		default:
			s.i++
		}
	}
	return s.b[start:], escaped
}

// value consumes one value at s.i.
func (s *keyScanner) value() string {
	if s.i >= len(s.b) {
		return ""
	}
	switch s.b[s.i] {
	case '{':
		return s.object()
	case '[':
		s.i++
		s.ws()
		s.path = append(s.path, step{})
		for n := 0; s.i < len(s.b) && s.b[s.i] != ']'; n++ {
			s.path[len(s.path)-1].idx = n
			if d := s.value(); d != "" {
				return d
			}
			s.ws()
			if s.i < len(s.b) && s.b[s.i] == ',' {
				s.i++
				s.ws()
			}
		}
		s.path = s.path[:len(s.path)-1]
		s.i++
	case '"':
		s.str()
	default: // number, true, false, null
		for s.i < len(s.b) {
			switch s.b[s.i] {
			case ',', ']', '}', ' ', '\t', '\r', '\n':
				return ""
			}
			s.i++
		}
	}
	return ""
}

// smallObject is the most keys an object's duplicate check compares
// one by one; past it they go in a map, so that a body of many keys costs
// time in proportion to its keys, not their square.
const smallObject = 16

func (s *keyScanner) object() string {
	s.i++
	s.ws()
	var keys [][]byte       // small objects: a linear search beats a map
	var set map[string]bool // past smallObject keys: the keys, for a bounded cost per key
	for s.i < len(s.b) && s.b[s.i] != '}' {
		raw, escaped := s.str()
		key := raw
		if escaped {
			var k string
			_ = json.Unmarshal(s.b[s.i-len(raw)-2:s.i], &k) // a valid JSON string: cannot fail
			key = []byte(k)
		}
		dup := set[string(key)]
		for _, k := range keys {
			dup = dup || bytes.Equal(k, key)
		}
		if dup {
			return fmt.Sprintf("duplicate key %q in %s", key, s.objectName())
		}
		if len(s.path) == 0 {
			for _, rk := range routerKeys {
				if len(key) == len(rk) && string(key) != rk && strings.EqualFold(string(key), rk) {
					return fmt.Sprintf("key %q: keys are case-sensitive (did you mean %q?)", key, rk)
				}
			}
		}
		switch {
		case set != nil:
			set[string(key)] = true
		case len(keys) == smallObject:
			set = make(map[string]bool, 2*smallObject)
			for _, k := range append(keys, key) {
				set[string(k)] = true
			}
			keys = nil
		default:
			keys = append(keys, key)
		}
		s.ws()
		s.i++ // ':'
		s.ws()
		s.path = append(s.path, step{key: key})
		if d := s.value(); d != "" {
			return d
		}
		s.path = s.path[:len(s.path)-1]
		s.ws()
		if s.i < len(s.b) && s.b[s.i] == ',' {
			s.i++
			s.ws()
		}
	}
	s.i++
	return ""
}

func (s *keyScanner) objectName() string {
	if len(s.path) == 0 {
		return "the request body"
	}
	// "messages[0].content": keys joined by ".", indexes in brackets.
	var b strings.Builder
	for _, e := range s.path {
		if e.key == nil {
			fmt.Fprintf(&b, "[%d]", e.idx)
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		b.Write(e.key)
	}
	return b.String()
}
