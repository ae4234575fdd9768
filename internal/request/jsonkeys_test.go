package request

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"kvrouter/internal/testwait"
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
		`{"model":"m","prompt":[[1,2],[3]],"Stream":true}`,
		`{"a":0,"b":1,"c":2,"d":3,"e":4,"f":5,"g":6,"h":7,"i":8,"j":9,"k":10,"l":11,"m":12,"n":13,"o":14,"p":15,"q":16,"r":17,"c":18}`} {
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

// TestAmbiguousKeyManyKeys: an object of many keys is checked in time
// proportional to its keys (a body of 200,000 top-level keys took minutes
// when each key was compared with every earlier one), and a duplicate
// found in the map past smallObject keys is still found, at any depth.
func TestAmbiguousKeyManyKeys(t *testing.T) {
	many := func(n int, last string) []byte {
		var b bytes.Buffer
		b.WriteString(`{"model":"m"`)
		for i := range n {
			fmt.Fprintf(&b, `,"k%d":1`, i)
		}
		b.WriteString(last + "}")
		return b.Bytes()
	}
	for _, tt := range []struct {
		name string
		body []byte
		want string
	}{
		{"distinct", many(200000, ""), ""},
		{"duplicate of an early key", many(200000, `,"k3":2`), `duplicate key "k3" in the request body`},
		{"duplicate of a late key", many(200000, `,"k199999":2`), `duplicate key "k199999" in the request body`},
		{"duplicate just past the small count", many(smallObject, `,"k0":2`), `duplicate key "k0" in the request body`},
		{"nested", append([]byte(`{"vllm_xargs":`), append(many(50000, `,"model":2`), '}')...), `duplicate key "model" in vllm_xargs`},
	} {
		done := make(chan string, 1)
		go func() { done <- ambiguousKey(tt.body) }()
		var got string
		testwait.Within(t, testwait.Default, tt.name+": the check of "+fmt.Sprint(len(tt.body))+" bytes to end", func() bool {
			select {
			case got = <-done:
				return true
			default:
				return false
			}
		})
		if got != tt.want {
			t.Errorf("%s: %q, want %q", tt.name, got, tt.want)
		}
	}
}
