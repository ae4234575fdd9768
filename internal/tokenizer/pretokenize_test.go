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
