package tokenizer

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
)

// bigArgs are tool-call arguments with integers beyond int64 (both signs,
// just past each limit, beyond uint64), a large int64, and floats beyond
// float64's range and below its smallest subnormal.
const bigArgs = `{"query": "Qwen3", "max_results": 123456789012345678901234567890, "offset": -123456789012345678901234567890, ` +
	`"edge": 9223372036854775808, "neg_edge": -9223372036854775809, "big_int64": 4611686018427387904, ` +
	`"budget": 1e400, "floor": -1e400, "tiny": 1e-400, "ids": [18446744073709551616, 1, -1]}`

// bigArgsPython is Python's json.dumps(json.loads(bigArgs),
// ensure_ascii=False), what transformers' tojson prints, from Debian's
// /usr/bin/python3 (3.11.2): every integer exact, 1e400 -> Infinity,
// -1e400 -> -Infinity, 1e-400 -> 0.0.
const bigArgsPython = `{"query": "Qwen3", "max_results": 123456789012345678901234567890, "offset": -123456789012345678901234567890, ` +
	`"edge": 9223372036854775808, "neg_edge": -9223372036854775809, "big_int64": 4611686018427387904, ` +
	`"budget": Infinity, "floor": -Infinity, "tiny": 0.0, "ids": [18446744073709551616, 1, -1]}`

// TestQwen3BigIntegerArguments renders chat.jsonl's web_search case (text
// from transformers' apply_chat_template) with its tool-call arguments
// replaced by bigArgs, as an object and as a JSON string (which vLLM
// parses with json.loads): the prompt must be transformers' text with the
// arguments replaced by Python's json.dumps of them.
func TestQwen3BigIntegerArguments(t *testing.T) {
	tmpl, err := NewChatTemplate(qwen3TemplateConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	const orig = `"arguments":{"query":"Qwen3","max_results":2}`
	var c chatCase
	for _, cc := range loadChatCases(t) {
		if bytes.Contains(cc.Messages, []byte(orig)) {
			c = cc
		}
	}
	if c.Messages == nil {
		t.Fatal("no chat.jsonl case with the web_search call")
	}
	want := strings.Replace(c.Text, `{"query": "Qwen3", "max_results": 2}`, bigArgsPython, 1)
	if want == c.Text {
		t.Fatal("the case's text does not hold the arguments")
	}
	for _, form := range []struct{ name, args string }{
		{"object", bigArgs},
		{"string", strconv.Quote(bigArgs)},
	} {
		t.Run(form.name, func(t *testing.T) {
			req := c.request()
			req.Messages = bytes.Replace(c.Messages, []byte(orig), []byte(`"arguments":`+form.args), 1)
			got, err := tmpl.Render(req)
			if err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Fatalf("rendered:\n%s\nwant:\n%s", got, want)
			}
		})
	}
	// A request whose int64s reach too near the int64 limit leaves no
	// room for placeholders that keep the order: left to the engine.
	req := c.request()
	req.Messages = bytes.Replace(c.Messages, []byte(orig), []byte(`"arguments":{"a":9223372036854775807,"b":9223372036854775808}`), 1)
	if _, err := tmpl.Render(req); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("int64 max beside a larger integer: %v, want ErrUnsupported", err)
	}
}

// TestBigIntPlaceholders: placeholders keep the order of the values they
// stand for (each sign apart, beyond every int64 of the request), never
// occur in the strings to avoid, and differ from another set's.
func TestBigIntPlaceholders(t *testing.T) {
	vals := []string{"-99999999999999999999999", "-9223372036854775809", "9223372036854775808", "10000000000000000000", "123456789012345678901234567890"}
	b := &bigInts{maxAbs: 5_000_000_000_000_000_000}
	for _, v := range vals {
		if _, err := b.value(v); err != nil {
			t.Fatal(err)
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	first, err := placeholders(b, nil, map[int64]bool{}, rng)
	if err != nil {
		t.Fatal(err)
	}
	// Avoid every digit string of the first set: the second must differ.
	var avoid []string
	taken := map[int64]bool{}
	for _, p := range first {
		avoid = append(avoid, "x"+strconv.FormatInt(max(p, -p), 10)+"y")
		taken[max(p, -p)] = true
	}
	second, err := placeholders(b, avoid, taken, rand.New(rand.NewPCG(1, 2)))
	if err != nil {
		t.Fatal(err)
	}
	for _, subst := range []map[string]int64{first, second} {
		for i := range vals {
			p := subst[vals[i]]
			if max(p, -p) <= 5_000_000_000_000_000_000 {
				t.Fatalf("placeholder %d for %s is not beyond the request's int64s", p, vals[i])
			}
			if i > 0 && subst[vals[i-1]] >= p {
				t.Fatalf("placeholders %d, %d do not keep the order of %s < %s", subst[vals[i-1]], p, vals[i-1], vals[i])
			}
		}
	}
	for _, v := range vals {
		if first[v] == second[v] || strings.Contains(strings.Join(avoid, " "), strconv.FormatInt(max(second[v], -second[v]), 10)) {
			t.Fatalf("second placeholder %d for %s is the first's or avoided", second[v], v)
		}
	}
	if r := restorer(first).Replace(strconv.FormatInt(first[vals[0]], 10)); r != vals[0] {
		t.Fatalf("restored %q, want %q", r, vals[0])
	}
}
