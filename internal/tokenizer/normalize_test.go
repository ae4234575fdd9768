package tokenizer

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

var forms = []norm.Form{norm.NFC, norm.NFD, norm.NFKC, norm.NFKD}

// TestUnicode9InertTable: ranges are sorted and disjoint, and every listed
// code point has non-trivial normalization properties in current Unicode
// (so under Unicode 9.0, where it was unassigned, it behaved differently).
func TestUnicode9InertTable(t *testing.T) {
	prev := rune(-1)
	for _, r := range unicode9Inert {
		if r[0] > r[1] || r[0] <= prev {
			t.Fatalf("range %X-%X out of order", r[0], r[1])
		}
		prev = r[1]
		for c := r[0]; c <= r[1]; c++ {
			s := string(c)
			trivial := true
			for _, f := range forms {
				p := f.PropertiesString(s)
				if p.CCC() != 0 || len(p.Decomposition()) != 0 || !p.BoundaryBefore() || !p.BoundaryAfter() {
					trivial = false
				}
			}
			if trivial {
				t.Errorf("U+%04X has trivial normalization properties today", c)
			}
			if !isUnicode9Inert(c) {
				t.Errorf("isUnicode9Inert(U+%04X) = false", c)
			}
		}
	}
	for _, c := range []rune{'a', 0x0301, 0x07FC, 0x1FBFA, 0x10FFFF} {
		if isUnicode9Inert(c) {
			t.Errorf("isUnicode9Inert(U+%04X) = true", c)
		}
	}
}

func hasInert(s string) bool {
	for _, r := range s {
		if isUnicode9Inert(r) {
			return true
		}
	}
	return false
}

// checkNorm: without inert code points unicodeNorm is x/text's form; with
// them the result is still equivalent; and it is idempotent.
func checkNorm(t *testing.T, s string) {
	for _, f := range forms {
		u := unicodeNorm{f}
		got := u.normalize(s)
		if !hasInert(s) && got != f.String(s) {
			t.Fatalf("%+q: unicodeNorm %+q, x/text %+q", s, got, f.String(s))
		}
		if f.String(got) != f.String(s) {
			t.Fatalf("%+q: result %+q not equivalent", s, got)
		}
		if again := u.normalize(got); again != got {
			t.Fatalf("%+q: not idempotent: %+q then %+q", s, got, again)
		}
	}
}

func TestUnicodeNormASCIIPrefix(t *testing.T) {
	// The ASCII prefix is skipped but for its last character, which may
	// compose with what follows, at every position around 8-byte words.
	for n := range 18 {
		prefix := strings.Repeat("x", n)
		for _, tail := range []string{"e\u0301", "\u0301", "<\u0338", "\u212b", "\ufb01", "\u00e9", "A\u030a\u0323"} {
			checkNorm(t, prefix+tail)
			checkNorm(t, prefix+tail+prefix)
		}
		checkNorm(t, prefix)
	}
}

func TestUnicodeNormGolden(t *testing.T) {
	for _, c := range readJSONL(t, qwenDir+"/encode.jsonl") {
		checkNorm(t, c.Text)
	}
	for _, c := range readJSONL(t, qwenDir+"/unicode_version_quirks.jsonl") {
		checkNorm(t, c.Text)
		if got := (unicodeNorm{norm.NFC}).normalize(c.Text); got != c.Text {
			// Each quirk text is already normal under Unicode 9.0.
			t.Errorf("%+q normalized to %+q", c.Text, got)
		}
	}
}

func FuzzNormalize(f *testing.F) {
	for _, c := range readJSONL(f, qwenDir+"/unicode_version_quirks.jsonl") {
		f.Add(c.Text)
	}
	f.Add("e\u0301\u0316\u09fe")
	f.Add("abcdefghe\u0301") // an ASCII prefix whose last character composes with what follows
	f.Add("abcdefgh\u0301x")
	f.Add("ab\u212b<\u0338")
	f.Fuzz(func(t *testing.T, s string) {
		if utf8.ValidString(s) {
			checkNorm(t, s)
		}
	})
}

func TestSimpleNormalizers(t *testing.T) {
	for _, c := range []struct{ json, in, want string }{
		{`{"type": "Prepend", "prepend": "▁"}`, "hi", "▁hi"},
		{`{"type": "Prepend", "prepend": "▁"}`, "", ""},
		{`{"type": "Replace", "pattern": {"String": "  "}, "content": " "}`, "a     b", "a   b"},
		{`{"type": "Strip", "strip_left": true, "strip_right": true}`, "\u3000 a \n", "a"},
		{`{"type": "Strip", "strip_left": false, "strip_right": true}`, " a ", " a"},
		{`{"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Strip", "strip_left": true, "strip_right": false}]}`, " ﬁ", "fi"},
		{`null`, "x", "x"},
	} {
		n, err := parseNormalizer(json.RawMessage(c.json))
		if err != nil {
			t.Fatalf("%s: %v", c.json, err)
		}
		got := c.in
		if n != nil {
			got = n.normalize(c.in)
		}
		if got != c.want {
			t.Errorf("%s on %q = %q, want %q", c.json, c.in, got, c.want)
		}
	}
}
