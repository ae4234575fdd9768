package request

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func TestAmbiguousKey(t *testing.T) {
	tests := []struct{ in, want string }{
		{`{"model":"a","prompt":"x"}`, ""},
		{`{"model":"a","model":"b"}`, `duplicate key "model" in the request body`},
		{`{"model":"a","\u006dodel":"b"}`, `duplicate key "model" in the request body`},
		{`{"a\"b":1,"a\"b":2}`, `duplicate key "a\"b" in the request body`},
		{`{"messages":[{"role":"user"},{"role":"a","content":"x","role":"b"}]}`, `duplicate key "role" in messages[1]`},
		{`{"vllm_xargs":{"k":{"x":1,"x":2}}}`, `duplicate key "x" in vllm_xargs.k`},
		{`{"a":{"x":1},"b":{"x":1}}`, ""},
		{`{"MODEL":"a"}`, `key "MODEL": keys are case-sensitive (did you mean "model"?)`},
		{`{"a":{"Model":1}}`, ""}, // only top-level keys are read by the router
		{`{"x":[1, 2 ,{"k":"v" , "j" : null}], "y" : "}\"{"}`, ""},
		{` { } `, ""},
		{`[{"a":1,"a":2}]`, `duplicate key "a" in [0]`},
	}
	for _, tt := range tests {
		if got := ambiguousKey([]byte(tt.in)); got != tt.want {
			t.Errorf("ambiguousKey(%s) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// refDuplicate is the reference: encoding/json's tokenizer, a key set per
// open object.
func refDuplicate(b []byte) bool {
	dec := json.NewDecoder(bytes.NewReader(b))
	type frame struct {
		obj, wantKey bool
		keys         map[string]bool
	}
	var stack []*frame
	afterValue := func() {
		if n := len(stack); n > 0 && stack[n-1].obj {
			stack[n-1].wantKey = true
		}
	}
	for {
		tok, err := dec.Token()
		if err != nil {
			return false
		}
		top := (*frame)(nil)
		if n := len(stack); n > 0 {
			top = stack[n-1]
		}
		if top != nil && top.obj && top.wantKey {
			if d, ok := tok.(json.Delim); ok && d == '}' {
				stack = stack[:len(stack)-1]
				afterValue()
				continue
			}
			k := tok.(string)
			if top.keys[k] {
				return true
			}
			top.keys[k] = true
			top.wantKey = false
			continue
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, &frame{obj: true, wantKey: true, keys: map[string]bool{}})
		case json.Delim('['):
			stack = append(stack, &frame{})
		case json.Delim(']'):
			stack = stack[:len(stack)-1]
			afterValue()
		default:
			afterValue()
		}
	}
}

func FuzzAmbiguousKey(f *testing.F) {
	// Small request-shaped seeds: the fuzzer minimizes every new input, and
	// large ones (the testdata JSON files) stall a 10 s run in minimization.
	for _, s := range []string{`{"model":"a","model":"b"}`, `{"a":[{"b":1,"c":{"b":2}}],"\u0061":3}`, `{"x":"\\"}`, `[1,{"k":[]}]`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],"vllm_xargs":{"kv_cache_report_mode":"full"}}`,
		`{"model":"m","prompt":[[1,2],[3]],"Stream":true}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if !json.Valid(b) {
			return
		}
		// ambiguousKey reports the first ambiguity it meets, so a document
		// with a case-folded known key and a duplicate may name either: a
		// duplicate it names must exist, and "" means there is none.
		got := ambiguousKey(b)
		ref := refDuplicate(b)
		if dup := strings.HasPrefix(got, "duplicate key"); dup && !ref || got == "" && ref {
			t.Fatalf("ambiguousKey(%q) = %q, reference duplicate = %v", b, got, ref)
		}
	})
}
