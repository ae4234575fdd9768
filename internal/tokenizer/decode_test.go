package tokenizer

import (
	"testing"
	"unicode/utf8"
)

func TestByteToChar(t *testing.T) {
	// GPT-2's table: space is Ġ (U+0120), newline Ċ (U+010A), printable
	// ASCII maps to itself, and the map is a bijection.
	if byteToChar[' '] != 'Ġ' || byteToChar['\n'] != 'Ċ' || byteToChar['a'] != 'a' || byteToChar[0xAD] != 'Ń' {
		t.Errorf("byteToChar: space %q newline %q a %q 0xAD %q", byteToChar[' '], byteToChar['\n'], byteToChar['a'], byteToChar[0xAD])
	}
	seen := map[rune]bool{}
	for b, r := range byteToChar {
		if seen[r] || charToByte[r] != int16(b) {
			t.Fatalf("byte %#x -> %q not a bijection", b, r)
		}
		seen[r] = true
	}
}

func TestLossyUTF8(t *testing.T) {
	// Maximal subparts (Unicode Table 3-7), as Rust's from_utf8_lossy.
	for _, c := range []struct{ in, want string }{
		{"abc", "abc"},
		{"\xe4\xb8", "\ufffd"},                 // truncated 3-byte sequence: one subpart
		{"\xe4\xb8a", "\ufffda"},               // ... followed by ASCII
		{"\xf0\x80\x80", "\ufffd\ufffd\ufffd"}, // F0 needs 90..BF second
		{"\xed\xa0\x80", "\ufffd\ufffd\ufffd"}, // surrogate
		{"\xf4\x90\x80\x80", "\ufffd\ufffd\ufffd\ufffd"},
		{"\xf0\x9f\x98", "\ufffd"},   // truncated emoji
		{"\xc0\xaf", "\ufffd\ufffd"}, // overlong
		{"\xff\xfe", "\ufffd\ufffd"},
		{"a\x80b", "a\ufffdb"},
		{"\xef\xbf\xbd", "\ufffd"}, // U+FFFD itself is valid
	} {
		if got := lossyUTF8([]byte(c.in)); got != c.want {
			t.Errorf("lossyUTF8(%+q) = %+q, want %+q", c.in, got, c.want)
		}
	}
}

func TestDecode(t *testing.T) {
	tok := loadQwen(t)
	ids := tok.Encode("中文 text", false)
	if got := tok.Decode(ids); got != "中文 text" {
		t.Errorf("Decode = %q", got)
	}
	// Special tokens are kept; unknown ids are skipped.
	if got := tok.Decode([]uint32{151644, 9707, 151645, 1 << 30}); got != "<|im_start|>Hello<|im_end|>" {
		t.Errorf("Decode specials = %q", got)
	}
	// A lone byte of a multi-byte character decodes to U+FFFD.
	e := tok.Encode("\U00016FF0", false) // [125427 123 108]: byte pieces
	if len(e) < 2 {
		t.Fatalf("U+16FF0 is %d tokens, want byte pieces", len(e))
	}
	if got := tok.Decode(e[:1]); !utf8.ValidString(got) || got != "\ufffd" {
		t.Errorf("Decode(first piece of U+16FF0) = %+q", got)
	}
}
