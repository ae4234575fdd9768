package config

import (
	"bytes"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// A YAML syntax error names the line of the problem; yaml.v3 alone names
// the line where the enclosing block starts, counted from 0 (the "yaml"
// column, checked so the test notices a yaml.v3 that changes).
func TestConfigSyntaxLine(t *testing.T) {
	for _, tc := range []struct {
		name, src, yaml, want string
	}{
		{"list item left of its siblings",
			"models:\n  - name: m\n    engines:\n      - url: http://a:1\n     - url: http://b:1\n",
			"yaml: line 1: did not find expected key", "line 5: did not find expected key"},
		{"list item right of its siblings",
			"models:\n  - name: m\n    engines:\n      - url: http://a:1\n       - url: http://b:1\n",
			"yaml: line 3: did not find expected '-' indicator", "line 5: did not find expected '-' indicator"},
		{"key left of its mapping",
			"models:\n  - name: m\n    engines:\n      - url: http://a:1\n   policy: kv\n",
			"yaml: line 1: did not find expected '-' indicator", "line 5: did not find expected '-' indicator"},
		{"after a flow list over two lines",
			"models:\n  - name: m\n    engines: [{url: http://a:1},\n      {url: http://b:1}]\n   - name: n\n",
			"yaml: line 1: did not find expected '-' indicator", "line 5: did not find expected '-' indicator"},
		{"flow list missing its bracket",
			"models:\n  - name: m\n    engines: [\n      {url: http://a:1}\n    policy: kv\n",
			"yaml: line 2: did not find expected ',' or ']'", "line 5: did not find expected ',' or ']'"},
		{"flow list open at the end",
			"models:\n  - name: m\n    engines: [{url: http://a:1},\n      {url: http://b:1}\n",
			"yaml: line 2: did not find expected ',' or ']'", "line 4: did not find expected ',' or ']'"},
		{"tab",
			"models:\n  - name: m\n\tpolicy: kv\n",
			"yaml: line 2: found a tab character that violates indentation", "line 3: found a tab character that violates indentation"},
		{"no line from yaml.v3",
			"listen: a: b\n",
			"yaml: mapping values are not allowed in this context", "line 1: mapping values are not allowed in this context"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var n yaml.Node
			if err := yaml.Unmarshal([]byte(tc.src), &n); err == nil || err.Error() != tc.yaml {
				t.Fatalf("yaml.v3 says %v, want %q", err, tc.yaml)
			}
			_, _, err := Parse([]byte(tc.src), func(string) string { return "" })
			if err == nil || err.Error() != "parse config: "+tc.want {
				t.Fatalf("got %v, want %q", err, "parse config: "+tc.want)
			}
		})
	}
}

// FuzzConfigSyntaxLine: for any input yaml.v3 refuses, the line named is
// within the input, its first N lines fail with yaml.v3's message (or are
// the whole input) and its first N-1 lines do not (or end inside a bracket,
// which a line "@" after them shows).
func FuzzConfigSyntaxLine(f *testing.F) {
	f.Add([]byte("models:\n  - name: m\n    engines:\n      - url: http://a:1\n     - url: http://b:1\n"))
	f.Add([]byte("a: [1,\n 2]\n b: 3\n"))
	f.Add([]byte("a: 'x\n\nb: 1\n"))
	f.Add([]byte("a: b: c"))
	f.Fuzz(func(t *testing.T, data []byte) {
		var n yaml.Node
		yerr := yaml.Unmarshal(data, &n)
		if yerr == nil || !reSyntax.MatchString(yerr.Error()) {
			return
		}
		msg := syntaxError(data, yerr).Error()
		num, rest, ok := strings.Cut(strings.TrimPrefix(msg, "line "), ": ")
		line, err := strconv.Atoi(num)
		if !strings.HasPrefix(msg, "line ") || !ok || err != nil || !strings.HasSuffix(yerr.Error(), rest) {
			t.Fatalf("%q for yaml.v3's %q", msg, yerr)
		}
		lines := bytes.SplitAfter(data, []byte("\n"))
		if len(lines[len(lines)-1]) == 0 {
			lines = lines[:len(lines)-1]
		}
		if line < 1 || line > len(lines) {
			t.Fatalf("line %d of %d", line, len(lines))
		}
		prefix := func(k int) []byte { return bytes.Join(lines[:k], nil) }
		counts := func(k int) bool {
			if k == len(lines) {
				return true
			}
			p := prefix(k)
			return sameError(p, yerr) && sameError(append(p[:len(p):len(p)], "\n@\n"...), yerr)
		}
		if !counts(line) || (line > 1 && counts(line-1)) {
			t.Fatalf("line %d: the first %d lines count %v, the first %d %v", line, line, counts(line), line-1, counts(line-1))
		}
	})
}
