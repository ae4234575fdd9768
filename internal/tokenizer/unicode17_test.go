package tokenizer

import (
	"slices"
	"testing"
	"unicode"
)

// TestUnicode17Golden: letters and digits new in Unicode 17 are
// [^\s\p{L}\p{N}] to Hugging Face's Oniguruma, so "X's" (X new) splits
// "X'" + "s" there; the scanners must agree (ids from unicode17_golden_test.go).
func TestUnicode17Golden(t *testing.T) {
	tok := loadQwen(t)
	if len(unicode17Golden) != 322 {
		t.Fatalf("%d cases, want 322", len(unicode17Golden))
	}
	for _, c := range unicode17Golden {
		if got := tok.Encode(c.text, false); !slices.Equal(got, c.ids) {
			t.Errorf("%+q: got %v, want HF's %v", c.text, got, c.ids)
		}
	}
}

// TestUnicodeTablesVersion pins the assumption behind newInUnicode17: Go's
// tables are Unicode 17.0.0. A toolchain with other tables needs the
// comparison in docs/tokenizer.md redone.
func TestUnicodeTablesVersion(t *testing.T) {
	if unicode.Version != "17.0.0" {
		t.Fatalf("unicode.Version = %s; newInUnicode17 was derived for 17.0.0", unicode.Version)
	}
	for _, r := range []rune{0x323B0, 0x11DE0, 0x088F} {
		if !unicode.IsLetter(r) && !unicode.IsNumber(r) || class(r) != clsOther {
			t.Errorf("%U: IsLetter %v IsNumber %v class %d", r, unicode.IsLetter(r), unicode.IsNumber(r), class(r))
		}
	}
}
