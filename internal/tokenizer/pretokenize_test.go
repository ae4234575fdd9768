package tokenizer

import (
	"slices"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

// scannedPatterns are the regexes with a hand-written scanner.
var scannedPatterns = []string{qwenPattern, llama3Pattern, gpt2Pattern}

func scanSplit(scan func(string, int) int, s string) []string {
	var out []string
	for i := 0; i < len(s); {
		j := scan(s, i)
		if j <= i || j > len(s) {
			panic("scanner did not advance")
		}
		out = append(out, s[i:j])
		i = j
	}
	return out
}

func regexpSplit(tb testing.TB, pattern, s string) []string {
	tb.Helper()
	re, err := compileRegex(pattern)
	if err != nil {
		tb.Fatal(err)
	}
	step := &splitStep{m: re, behavior: isolated}
	return step.splitGeneric(nil, s)
}

// regexpFoldGap reports whether s holds "'" followed by U+017F: Oniguruma
// (and the scanners) fold U+017F to 's' under (?i); regexp2 does not. The
// golden test "it'ſa" pins Hugging Face's behaviour.
//
// It also reports code points of newInUnicode17: regexp2 classifies them
// with Go's Unicode 17 tables, the scanners as Hugging Face's Oniguruma
// (Unicode 16) does; TestUnicode17Golden pins Hugging Face's ids.
func regexpFoldGap(s string) bool {
	return strings.Contains(s, "'ſ") || strings.ContainsFunc(s, func(r rune) bool { return unicode.Is(newInUnicode17, r) })
}

func TestScannersMatchRegexp2(t *testing.T) {
	texts := []string{
		"", "a", " ", "  ", "\n", " \n ", "it's", "IT'S", "we'LL", "'", "''s", "x'", "Hello  world  ",
		"a\t\tb", "a \t b", "1234567", " 123 4", "foo\r\n\r\nbar", "  \n\n  x", "x  \n", "...!!!\n\n",
		" !x", "\u00a0\u00a0a", "\u3000中文", "a\u0085b", "a\ufeffb", "é\u0301", "😀😀 x", "٣٤٥ ½",
		"\r", "\r\r \r", " - ", "- -\n", "a'b'c", " 'll", "\t'", "x\u2028\u2029y",
	}
	for _, c := range readJSONL(t, qwenDir+"/encode.jsonl") {
		texts = append(texts, c.Text)
	}
	for _, p := range scannedPatterns {
		scan := scannerFor(p)
		for _, s := range texts {
			if regexpFoldGap(s) {
				continue
			}
			got, want := scanSplit(scan, s), regexpSplit(t, p, s)
			if !slices.Equal(got, want) {
				t.Errorf("pattern %.20q… on %q:\nscanner %q\nregexp2 %q", p, s, got, want)
			}
		}
	}
}

// FuzzScanVsRegexp2 checks that each hand-written scanner splits exactly
// as regexp2 runs the same pattern.
func FuzzScanVsRegexp2(f *testing.F) {
	for _, c := range readJSONL(f, qwenDir+"/encode.jsonl") {
		f.Add(c.Text)
	}
	res := make([]*regexMatcher, len(scannedPatterns))
	for i, p := range scannedPatterns {
		re, err := compileRegex(p)
		if err != nil {
			f.Fatal(err)
		}
		res[i] = re
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) || regexpFoldGap(s) || len(s) > 4096 {
			return
		}
		for i, p := range scannedPatterns {
			got := scanSplit(scannerFor(p), s)
			want := (&splitStep{m: res[i], behavior: isolated}).splitGeneric(nil, s)
			if !slices.Equal(got, want) {
				t.Fatalf("pattern %.20q… on %q:\nscanner %q\nregexp2 %q", p, s, got, want)
			}
		}
	})
}

func TestRegexp2DefaultSpaceIsOniguruma(t *testing.T) {
	// Hugging Face's Oniguruma \s includes U+0085 and excludes U+FEFF;
	// regexp2's default mode agrees (its ECMAScript mode would not).
	re, err := compileRegex(`\s`)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		s    string
		want int
	}{{"\u0085", 1}, {"\ufeff", 0}, {"\u00a0", 1}, {"\u180e", 0}, {"\u3000", 1}, {"\x0b", 1}} {
		if got := len(re.find(nil, c.s)); got != c.want {
			t.Errorf("regexp2 \\s on %+q: %d matches, want %d", c.s, got, c.want)
		}
	}
}

// scanFastAgrees checks scanCL100KFast against scanCL100K at every rune
// start of s (valid UTF-8) and returns how often the fast path answered.
func scanFastAgrees(t *testing.T, s string) (answered int) {
	t.Helper()
	for _, d := range []int{1, 3} {
		for i := range s {
			fast := scanCL100KFast(s, i, d)
			if fast < 0 {
				continue
			}
			answered++
			if slow := scanCL100K(s, i, d); fast != slow {
				t.Fatalf("maxDigits %d at %d of %q: fast path ends at %d, scanCL100K at %d", d, i, s, fast, slow)
			}
		}
	}
	return answered
}

func TestScanFastMatchesScan(t *testing.T) {
	texts := []string{
		"Hello world", "it's", "IT'S", " 'll", "'", "''s", "x'ſ", "a'b", "12345", "1\u0663", "12\u00bd",
		"  x", "  \u00a0", "a\u00e9", "ab\u00e9", " \u00e9", ".\u00e9", "!!\u00e9", " !\u00e9", "\t\n \u3000",
		"x  \n", "  \n\n  x", "foo\r\n\r\nbar", "...!!!\n\n", " - ", "- -\n", "\r\r \r", "a \t b",
		"x  ", "x \u0085", "\u0085", "a\u0085b", "\u4e2d\u6587", "{\"k\": [1, 2]}\n\tif (x) {\n\t\treturn;\n\t}",
	}
	for _, c := range readJSONL(t, qwenDir+"/encode.jsonl") {
		texts = append(texts, c.Text)
	}
	answered := 0
	for _, s := range texts {
		answered += scanFastAgrees(t, s)
	}
	// Not vacuous: the fast path decides every match of ASCII prose.
	prose := "The quick brown fox, it's 42 years old!\n\n  Jumps over\tthe lazy dog...  "
	if n := scanFastAgrees(t, prose); n != 2*len(prose) {
		t.Errorf("fast path answered at %d of %d positions of ASCII prose", n, 2*len(prose))
	}
	if answered == 0 {
		t.Error("fast path never answered")
	}
}

// FuzzScanFast checks that the ASCII fast path of the Qwen and Llama-3
// scanners, wherever it answers, ends the match where scanCL100K does
// (which FuzzScanVsRegexp2 checks against regexp2).
func FuzzScanFast(f *testing.F) {
	for _, c := range readJSONL(f, qwenDir+"/encode.jsonl") {
		f.Add(c.Text)
	}
	f.Add("a\u00e9 \u00a0x 1\u0663 .\u00e9")
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) || len(s) > 4096 {
			return
		}
		scanFastAgrees(t, s)
	})
}

func TestLetterBytes(t *testing.T) {
	// Every byte value in every lane, beside bytes of other kinds.
	for c := range 256 {
		for lane := range 8 {
			for _, fill := range []byte{'a', 'Z', ' ', 0x80, 0xff, '@', '['} {
				var w uint64
				for k := range 8 {
					b := fill
					if k == lane {
						b = byte(c)
					}
					w |= uint64(b) << (8 * k)
				}
				m := letterBytes(w)
				for k := range 8 {
					b := byte(w >> (8 * k))
					want := byteClass[b] == clsLetter
					if got := m>>(8*k+7)&1 == 1; got != want {
						t.Fatalf("letterBytes(%#016x) byte %d (%#02x): letter %v, want %v", w, k, b, got, want)
					}
				}
				if m&^highBits != 0 {
					t.Fatalf("letterBytes(%#016x) = %#016x: bits beside the high bits", w, m)
				}
			}
		}
	}
}
