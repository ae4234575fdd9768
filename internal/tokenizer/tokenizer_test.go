package tokenizer

import (
	"bufio"
	"encoding/json"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

const qwenDir = "../../testdata/tokenizer/qwen3"

// qwen loads the vendored Qwen3 tokenizer once per test binary.
var qwen = sync.OnceValues(func() (*Tokenizer, error) { return Load(qwenDir) })

func loadQwen(tb testing.TB) *Tokenizer {
	tb.Helper()
	tok, err := qwen()
	if err != nil {
		tb.Fatalf("Load(%s): %v", qwenDir, err)
	}
	return tok
}

type goldenCase struct {
	Text              string   `json:"text"`
	IDs               []uint32 `json:"ids"`
	IDsCurrentUnicode []uint32 `json:"ids_current_unicode"`
	Note              string   `json:"note"`
}

func readJSONL(tb testing.TB, name string) []goldenCase {
	tb.Helper()
	f, err := os.Open(name)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	var out []goldenCase
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<26)
	for sc.Scan() {
		var c goldenCase
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			tb.Fatalf("%s line %d: %v", name, len(out)+1, err)
		}
		out = append(out, c)
	}
	if err := sc.Err(); err != nil {
		tb.Fatal(err)
	}
	return out
}

// TestEncodeGolden checks every reference case from Hugging Face
// tokenizers 0.23.2 (add_special_tokens=false) id for id.
func TestEncodeGolden(t *testing.T) {
	tok := loadQwen(t)
	cases := readJSONL(t, qwenDir+"/encode.jsonl")
	if len(cases) != 464 {
		t.Fatalf("encode.jsonl has %d cases, want 464", len(cases))
	}
	failed := 0
	for i, c := range cases {
		got := tok.Encode(c.Text, false)
		if !slices.Equal(got, c.IDs) {
			failed++
			if failed <= 20 {
				t.Errorf("case %d %q:\n got %v\nwant %v", i, c.Text, got, c.IDs)
			}
		}
	}
	if failed > 0 {
		t.Errorf("%d of %d cases differ", failed, len(cases))
	}
}

// TestUnicodeVersionQuirks: Hugging Face normalizes with Unicode 9.0
// tables; the tokenizer reproduces that (see unicodeNorm), so these texts
// get HF's ids, not the ids current-Unicode NFC would give.
func TestUnicodeVersionQuirks(t *testing.T) {
	tok := loadQwen(t)
	cases := readJSONL(t, qwenDir+"/unicode_version_quirks.jsonl")
	if len(cases) == 0 {
		t.Fatal("no quirk cases")
	}
	for i, c := range cases {
		got := tok.Encode(c.Text, false)
		if !slices.Equal(got, c.IDs) {
			t.Errorf("case %d %+q: got %v, want HF's %v (current-Unicode ids %v)", i, c.Text, got, c.IDs, c.IDsCurrentUnicode)
		}
	}
}

// hasAddedToken reports whether s contains an added token's content.
func hasAddedToken(tok *Tokenizer, s string) bool {
	for _, a := range tok.added.byID {
		if strings.Contains(s, a.Content) {
			return true
		}
	}
	return false
}

// checkRoundTrip asserts the encode/decode properties for one input.
func checkRoundTrip(t *testing.T, tok *Tokenizer, s string) {
	ids := tok.Encode(s, false)
	if !slices.Equal(tok.Encode(s, true), ids) { // Qwen3 adds no special tokens
		t.Fatalf("%+q: add_special_tokens changed the ids", s)
	}
	if !utf8.ValidString(s) {
		if want := tok.Encode(validUTF8(s), false); !slices.Equal(ids, want) {
			t.Fatalf("%+q: ids %v differ from the U+FFFD-replaced text's %v", s, ids, want)
		}
		return
	}
	dec := tok.Decode(ids)
	// Always: the decoded text is canonically equivalent to the input.
	if norm.NFC.String(dec) != norm.NFC.String(s) {
		t.Fatalf("%+q: NFC(Decode(Encode)) = %+q, want NFC(s) = %+q", s, norm.NFC.String(dec), norm.NFC.String(s))
	}
	// Without literal added tokens the whole text is normalized as one
	// piece: Decode(Encode(s)) is exactly the normalizer's output, which is
	// NFC(s) except around code points unassigned in Unicode 9.0.
	if !hasAddedToken(tok, s) {
		if want := tok.norm.normalize(s); dec != want {
			t.Fatalf("%+q: Decode(Encode) = %+q, want %+q", s, dec, want)
		}
	}
}

func TestRoundTripGolden(t *testing.T) {
	tok := loadQwen(t)
	for _, c := range readJSONL(t, qwenDir+"/encode.jsonl") {
		checkRoundTrip(t, tok, c.Text)
	}
}

// FuzzEncode: Encode never panics on arbitrary bytes, and round-trips.
func FuzzEncode(f *testing.F) {
	for _, c := range readJSONL(f, qwenDir+"/encode.jsonl") {
		f.Add(c.Text)
	}
	f.Add("\xff\xfe<|im_start|>\xe4\xb8")
	f.Add("<|im_start|>\u0338 it'ſa \u0085\ufeff") // NFC across an added token; ſ contraction; \s corners
	tok := loadQwen(f)
	f.Fuzz(func(t *testing.T, s string) {
		checkRoundTrip(t, tok, s)
	})
}

func TestInvalidUTF8(t *testing.T) {
	tok := loadQwen(t)
	for _, c := range []struct{ in, want string }{
		{"\xff", "\ufffd"},
		{"a\xffb", "a\ufffdb"},
		{"\xe4\xb8", "\ufffd\ufffd"}, // one U+FFFD per byte
		{"\xed\xa0\x80", "\ufffd\ufffd\ufffd"},
		{"<|im_end|>\xc0", "<|im_end|>\ufffd"},
		{"ok", "ok"},
	} {
		if got := validUTF8(c.in); got != c.want {
			t.Errorf("validUTF8(%+q) = %+q, want %+q", c.in, got, c.want)
		}
		if got, want := tok.Encode(c.in, false), tok.Encode(c.want, false); !slices.Equal(got, want) {
			t.Errorf("Encode(%+q) = %v, want %v", c.in, got, want)
		}
	}
}

// TestConcurrentEncode runs many goroutines over one Tokenizer (run with
// -race) and checks each result against a sequential encoding.
func TestConcurrentEncode(t *testing.T) {
	tok := loadQwen(t)
	cases := readJSONL(t, qwenDir+"/encode.jsonl")
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := g; i < len(cases); i += 3 {
				if got := tok.Encode(cases[i].Text, false); !slices.Equal(got, cases[i].IDs) {
					t.Errorf("goroutine %d case %d differs", g, i)
					return
				}
			}
		})
	}
	wg.Wait()
}

// TestWorstCasesExact checks the long single pre-tokens (merged by the
// heap) against Hugging Face's ids, run-length encoded as [id, count].
// Their speed is measured by BenchmarkWorstCase.
func TestWorstCasesExact(t *testing.T) {
	tok := loadQwen(t)
	want := map[string][][2]uint32{ // Hugging Face tokenizers 0.23.2
		"cjk=50000":           {{15946, 50000}},
		"spaces=100000":       {{56940, 781}, {786, 1}},
		"digits=30000":        {{22, 30000}},
		"letters=100000":      {{69440, 12500}},
		"newlines=100000":     {{79083, 3125}},
		"punct=100000":        {{12, 1}, {95523, 6249}, {55803, 1}, {33852, 1}, {10829, 1}, {28, 1}},
		"space-letter=100000": {{264, 50000}},
	}
	for _, w := range worstCases {
		var rle [][2]uint32
		for _, id := range tok.Encode(w.text, false) {
			if n := len(rle); n > 0 && rle[n-1][0] == id {
				rle[n-1][1]++
			} else {
				rle = append(rle, [2]uint32{id, 1})
			}
		}
		if !slices.Equal(rle, want[w.name]) {
			t.Errorf("%s: got %v, want %v", w.name, rle, want[w.name])
		}
	}
}

// plainTokenizer is tok without its fast paths: the pre-tokenizer split
// by scanCL100K alone into a slice of pieces (no ASCII fast path, no
// fused scan and encode), every pre-token merged from bytes (no word
// cache, no per-call front cache).
func plainTokenizer(tb testing.TB, tok *Tokenizer) *Tokenizer {
	tb.Helper()
	d := tok.scanDigits
	if d == 0 {
		tb.Fatal("tokenizer has no scanCL100K pre-tokenizer")
	}
	plain, m := withCache(tok)
	m.cache = nil
	plain.pre = pipeline{&splitStep{behavior: isolated, scan: func(s string, i int) int { return scanCL100K(s, i, d) }}}
	plain.scanDigits = 0
	return plain
}

func TestEncodeFastPathsExact(t *testing.T) {
	tok := loadQwen(t)
	plain := plainTokenizer(t, tok)
	var texts []string
	for _, c := range readJSONL(t, qwenDir+"/encode.jsonl") {
		texts = append(texts, c.Text)
	}
	// All of them in one text: repeated words hit the caches, and front
	// cache slots are reused by other words.
	texts = append(texts, strings.Repeat(strings.Join(texts, "\n"), 3))
	for _, s := range texts {
		if got, want := tok.Encode(s, false), plain.Encode(s, false); !slices.Equal(got, want) {
			t.Fatalf("Encode(%.60q…) = %d ids, plain encode %d ids, first difference at %d", s, len(got), len(want), firstDiffIDs(got, want))
		}
	}
}

// FuzzEncodeFastPaths checks Encode, with its ASCII scan, fused scan and
// encode, word cache and front cache, against the plain encode on
// arbitrary input, encoded twice so the second run hits the caches.
func FuzzEncodeFastPaths(f *testing.F) {
	for _, c := range readJSONL(f, qwenDir+"/encode.jsonl") {
		f.Add(c.Text)
	}
	f.Add("a\u00e9 \u00a0x 1\u0663 .\u00e9 it's <|im_start|>x\n\n  y")
	tok := loadQwen(f)
	plain := plainTokenizer(f, tok)
	f.Fuzz(func(t *testing.T, s string) {
		want := plain.Encode(s, false)
		for range 2 {
			if got := tok.Encode(s, false); !slices.Equal(got, want) {
				t.Fatalf("Encode(%q) = %v, plain encode %v", s, got, want)
			}
		}
	})
}
