package tokenizer

import (
	"math/bits"
	"unicode"
	"unicode/utf8"
)

// Hand-written equivalents of the pre-tokenizer regexes real byte-level
// models use. regexp2 is a backtracking engine on []rune and dominates the
// encoding cost; these scanners run the same alternation by hand in one
// pass. Each must give exactly the splits of Hugging Face's Oniguruma: the
// differential fuzz test FuzzScanVsRegexp2 compares them with regexp2 and
// the golden tests compare ids with Hugging Face.

// Patterns with a hand-written scanner.
const (
	// qwenPattern is Qwen2/2.5/3's Split regex (one digit per piece).
	qwenPattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// llama3Pattern is Llama-3.x's Split regex (up to three digits).
	llama3Pattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

// scannerFor returns the hand-written scanner for pattern, or nil.
func scannerFor(pattern string) func(s string, i int) int {
	switch pattern {
	case qwenPattern:
		return func(s string, i int) int { return scanCL100KAny(s, i, 1) }
	case llama3Pattern:
		return func(s string, i int) int { return scanCL100KAny(s, i, 3) }
	case gpt2Pattern:
		return scanGPT2
	}
	return nil
}

// cl100kDigits is scanCL100K's maxDigits for pattern, or 0 if pattern is
// neither the Qwen nor the Llama-3 one.
func cl100kDigits(pattern string) int {
	switch pattern {
	case qwenPattern:
		return 1
	case llama3Pattern:
		return 3
	}
	return 0
}

// Character classes as Oniguruma sees them.
const (
	clsOther  = iota // [^\s\p{L}\p{N}]
	clsLetter        // \p{L}
	clsNumber        // \p{N}
	clsSpace         // \s (Unicode White_Space)
)

var asciiClass = func() (t [utf8.RuneSelf]uint8) {
	for c := range t {
		r := rune(c)
		switch {
		case unicode.IsLetter(r):
			t[c] = clsLetter
		case unicode.IsNumber(r):
			t[c] = clsNumber
		case unicode.IsSpace(r):
			t[c] = clsSpace
		}
	}
	return t
}()

func class(r rune) uint8 {
	if r < utf8.RuneSelf {
		return asciiClass[r]
	}
	switch {
	case unicode.IsLetter(r):
		if unicode.Is(newInUnicode17, r) {
			return clsOther
		}
		return clsLetter
	case unicode.IsNumber(r):
		if unicode.Is(newInUnicode17, r) {
			return clsOther
		}
		return clsNumber
	case unicode.IsSpace(r):
		return clsSpace
	}
	return clsOther
}

// at decodes the rune at byte offset i of s (valid UTF-8, i < len(s)).
func at(s string, i int) (rune, int) {
	if c := s[i]; c < utf8.RuneSelf {
		return rune(c), 1
	}
	return utf8.DecodeRuneInString(s[i:])
}

// classAt is the class of the rune at i and its width; (clsEnd, 0) at the end.
func classAt(s string, i int) (uint8, int) {
	if i >= len(s) {
		return clsEnd, 0
	}
	if c := s[i]; c < utf8.RuneSelf {
		return asciiClass[c], 1
	}
	r, n := utf8.DecodeRuneInString(s[i:])
	return class(r), n
}

const clsEnd = 255

// skipClass returns the end of the run of class c starting at i.
func skipClass(s string, i int, c uint8) int {
	for i < len(s) {
		k, n := classAt(s, i)
		if k != c {
			break
		}
		i += n
	}
	return i
}

// contraction reports the length of a contraction suffix ('s 't 're 've
// 'm 'll 'd without the apostrophe) at s[i:], or 0. With fold, matching
// is case-insensitive the way Oniguruma folds: 's' also matches U+017F
// LATIN SMALL LETTER LONG S.
func contraction(s string, i int, fold bool) int {
	if i >= len(s) {
		return 0
	}
	lower := func(c byte) byte {
		if fold && 'A' <= c && c <= 'Z' {
			return c + 'a' - 'A'
		}
		return c
	}
	c := lower(s[i])
	switch c {
	case 's', 't', 'm', 'd':
		return 1
	case 'r', 'v':
		if i+1 < len(s) && lower(s[i+1]) == 'e' {
			return 2
		}
	case 'l':
		if i+1 < len(s) && lower(s[i+1]) == 'l' {
			return 2
		}
	case 0xC5: // U+017F is C5 BF
		if fold && i+1 < len(s) && s[i+1] == 0xBF {
			return 2
		}
	}
	return 0
}

// scanCL100K returns the end of the match starting at i (< len(s)) of
// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,maxDigits}|
// ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`, trying alternatives
// in order as a backtracking engine does.
func scanCL100K(s string, i, maxDigits int) int {
	r, n := at(s, i)
	c := class(r)
	// (?i:'s|'t|'re|'ve|'m|'ll|'d)
	if r == '\'' {
		if k := contraction(s, i+1, true); k > 0 {
			return i + 1 + k
		}
	}
	// [^\r\n\p{L}\p{N}]?\p{L}+
	if c == clsLetter {
		return skipClass(s, i+n, clsLetter)
	}
	if c != clsNumber && r != '\r' && r != '\n' {
		if k, m := classAt(s, i+n); k == clsLetter {
			return skipClass(s, i+n+m, clsLetter)
		}
	}
	// \p{N}{1,maxDigits}
	if c == clsNumber {
		j := i + n
		for d := 1; d < maxDigits; d++ {
			k, m := classAt(s, j)
			if k != clsNumber {
				break
			}
			j += m
		}
		return j
	}
	// ' ?[^\s\p{L}\p{N}]+[\r\n]*'
	j := i
	if r == ' ' {
		if k, _ := classAt(s, i+1); k == clsOther {
			j = i + 1
		}
	}
	if k, _ := classAt(s, j); k == clsOther {
		j = skipClass(s, j, clsOther)
		for j < len(s) && (s[j] == '\r' || s[j] == '\n') {
			j++
		}
		return j
	}
	// Here c is clsSpace. \s*[\r\n]+ matches up to the last \r or \n of
	// the whitespace run; otherwise \s+(?!\S) takes the run, minus its
	// last character when a non-space follows; otherwise \s+.
	end, lastNL, lastStart := i, -1, i
	for end < len(s) {
		k, m := classAt(s, end)
		if k != clsSpace {
			break
		}
		if s[end] == '\r' || s[end] == '\n' {
			lastNL = end
		}
		lastStart = end
		end += m
	}
	if lastNL >= 0 {
		return lastNL + 1
	}
	if end == len(s) || lastStart == i {
		return end
	}
	return lastStart
}

// scanCL100KAny is scanCL100K, taking the ASCII fast path when it can.
func scanCL100KAny(s string, i, maxDigits int) int {
	if j := scanCL100KFast(s, i, maxDigits); j >= 0 {
		return j
	}
	return scanCL100K(s, i, maxDigits)
}

// clsHigh is byteClass's class for a byte of a multi-byte UTF-8
// sequence: its rune's class needs decoding.
const clsHigh = 4

// byteClass is asciiClass for every byte value, clsHigh from 0x80 up, so
// the fast scanner reads one table entry per byte without a range check.
var byteClass = func() (t [256]uint8) {
	copy(t[:], asciiClass[:])
	for c := utf8.RuneSelf; c < 256; c++ {
		t[c] = clsHigh
	}
	return t
}()

// scanCL100KFast is scanCL100K for a match decided by ASCII bytes alone
// (the common case in English text and code). It returns -1 as soon as
// the match would depend on a byte of a multi-byte rune, whose class it
// does not decode; the caller then runs scanCL100K. Whenever it returns a
// position it is scanCL100K's (FuzzScanFast checks this on arbitrary
// input).
func scanCL100KFast(s string, i, maxDigits int) int {
	n := len(s)
	b := s[i]
	c := byteClass[b]
	switch {
	case c == clsHigh:
		return -1
	case c == clsLetter:
		// \p{L}+
		return skipLetters(s, i+1)
	case c == clsNumber:
		// \p{N}{1,maxDigits}
		j := i + 1
		for d := 1; d < maxDigits && j < n; d++ {
			k := byteClass[s[j]]
			if k == clsHigh {
				return -1
			}
			if k != clsNumber {
				break
			}
			j++
		}
		return j
	}
	// c is clsOther or clsSpace.
	if b == '\'' {
		if k := contraction(s, i+1, true); k > 0 {
			return i + 1 + k
		}
	}
	var next uint8 = clsEnd // class of the byte after b
	if i+1 < n {
		next = byteClass[s[i+1]]
	}
	if next == clsHigh {
		return -1
	}
	// [^\r\n\p{L}\p{N}]?\p{L}+
	if next == clsLetter && b != '\r' && b != '\n' {
		return skipLetters(s, i+2)
	}
	// ' ?[^\s\p{L}\p{N}]+[\r\n]*'
	j := -1
	if c == clsOther {
		j = i
	} else if b == ' ' && next == clsOther {
		j = i + 1
	}
	if j >= 0 {
		j = skipASCII(s, j, clsOther)
		if j < 0 {
			return -1
		}
		for j < n && (s[j] == '\r' || s[j] == '\n') {
			j++
		}
		return j
	}
	// Whitespace, as in scanCL100K; every character of the run is one byte.
	end, lastNL := i, -1
	for end < n {
		k := byteClass[s[end]]
		if k == clsHigh {
			return -1
		}
		if k != clsSpace {
			break
		}
		if s[end] == '\r' || s[end] == '\n' {
			lastNL = end
		}
		end++
	}
	if lastNL >= 0 {
		return lastNL + 1
	}
	if end == n || end-1 == i {
		return end
	}
	return end - 1
}

// skipLetters is skipASCII(s, i, clsLetter), eight bytes at a time.
func skipLetters(s string, i int) int {
	for i+8 <= len(s) {
		if m := letterBytes(le64(s[i:])); m != highBits {
			i += bits.TrailingZeros64(^m&highBits) >> 3 // the first non-letter
			if s[i] >= utf8.RuneSelf {
				return -1
			}
			return i
		}
		i += 8
	}
	return skipASCII(s, i, clsLetter)
}

const highBits = 0x8080808080808080

// letterBytes returns the high bit of each byte of w (little-endian) that
// is an ASCII letter, A-Z or a-z, and no other bit: a byte below 0x80 is a
// letter when it is between 'a' and 'z' with bit 0x20 set. Each byte sum
// stays below 0x100, so no carry crosses bytes.
func letterBytes(w uint64) uint64 {
	y := w&^highBits | 0x2020202020202020
	ge := y + 0x1f1f1f1f1f1f1f1f // high bit: y >= 'a' (0x61)
	gt := y + 0x0505050505050505 // high bit: y > 'z' (0x7a)
	return ge &^ gt &^ w & highBits
}

// skipASCII returns the end of the run of ASCII bytes of class c from i,
// or -1 if the run ends at a byte of a multi-byte rune (which might
// continue it).
func skipASCII(s string, i int, c uint8) int {
	for ; i < len(s); i++ {
		k := byteClass[s[i]]
		if k != c {
			if k == clsHigh {
				return -1
			}
			break
		}
	}
	return i
}

// scanGPT2 returns the end of the match starting at i (< len(s)) of
// gpt2Pattern: `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+|
// ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`.
func scanGPT2(s string, i int) int {
	r, _ := at(s, i)
	if r == '\'' {
		if k := contraction(s, i+1, false); k > 0 {
			return i + 1 + k
		}
	}
	j := i
	if r == ' ' {
		j = i + 1
	}
	if k, _ := classAt(s, j); k != clsSpace && k != clsEnd {
		return skipClass(s, j, k)
	}
	// whitespace run
	end, lastStart := i, i
	for end < len(s) {
		k, m := classAt(s, end)
		if k != clsSpace {
			break
		}
		lastStart = end
		end += m
	}
	if end == len(s) || lastStart == i {
		return end
	}
	return lastStart
}

// newInUnicode17 holds the 4,657 code points that Go's unicode package
// (Unicode 17.0.0 in Go 1.27) counts as \p{L} or \p{N} but Hugging Face
// tokenizers 0.23.2's Oniguruma (older tables) does not: letters and
// digits assigned in Unicode 17, e.g. CJK Extension J U+323B0-U+33479 and
// the digits U+11DE0-U+11DE9. Oniguruma treats them as [^\s\p{L}\p{N}],
// so the scanners do too: "\U000323B0's" splits "\U000323B0'" + "s", not
// "\U000323B0" + "'s". Derived by running each class regex through HF's own
// Split pre-tokenizer on every code point U+0000-U+10FFFF and comparing with
// unicode.IsLetter/IsNumber; \s agrees everywhere. See docs/tokenizer.md.
var newInUnicode17 = &unicode.RangeTable{
	R16: []unicode.Range16{
		{0x088F, 0x088F, 1},
		{0x0C5C, 0x0C5C, 1},
		{0x0CDC, 0x0CDC, 1},
		{0xA7CE, 0xA7CF, 1},
		{0xA7D2, 0xA7D2, 1},
		{0xA7D4, 0xA7D4, 1},
		{0xA7F1, 0xA7F1, 1},
	},
	R32: []unicode.Range32{
		{0x10940, 0x10959, 1},
		{0x10EC5, 0x10EC7, 1},
		{0x11DB0, 0x11DDB, 1},
		{0x11DE0, 0x11DE9, 1},
		{0x16EA0, 0x16EB8, 1},
		{0x16EBB, 0x16ED3, 1},
		{0x16FF2, 0x16FF6, 1},
		{0x187F8, 0x187FF, 1},
		{0x18D09, 0x18D1E, 1},
		{0x18D80, 0x18DF2, 1},
		{0x1E6C0, 0x1E6DE, 1},
		{0x1E6E0, 0x1E6E2, 1},
		{0x1E6E4, 0x1E6E5, 1},
		{0x1E6E7, 0x1E6ED, 1},
		{0x1E6F0, 0x1E6F4, 1},
		{0x1E6FE, 0x1E6FF, 1},
		{0x2B73A, 0x2B73F, 1},
		{0x2CEA2, 0x2CEAD, 1},
		{0x323B0, 0x33479, 1},
	},
}
