package tokenizer

import (
	"regexp"
	"slices"
	"strings"
	"testing"
)

// Benchmarks report tokens/s per core (one goroutine) on prose, code and
// CJK built from the golden texts, with the word cache warm and cold, and
// the worst-case inputs the issue bounds. Run:
//
//	go test -run '^$' -bench . -benchtime 1s -count 1 ./internal/tokenizer/

var codeRE = regexp.MustCompile(`[{};=]|def |func |return|class |import `)

// corpus joins the encode.jsonl texts of one kind, repeated, into about
// size bytes.
func corpus(tb testing.TB, kind string, size int) string {
	tb.Helper()
	parts := corpusTexts(tb, kind)
	var b strings.Builder
	for i := 0; b.Len() < size; i++ {
		if i > 0 {
			b.WriteString("\n")
		}
		b.WriteString(parts[i%len(parts)])
	}
	return b.String()
}

// corpusTexts returns the distinct encode.jsonl texts of one kind.
func corpusTexts(tb testing.TB, kind string) []string {
	tb.Helper()
	var parts []string
	for _, c := range readJSONL(tb, qwenDir+"/encode.jsonl") {
		ascii := true
		cjk := false
		for _, r := range c.Text {
			if r >= 0x80 {
				ascii = false
			}
			if r >= 0x3040 && r <= 0x30FF || r >= 0x4E00 && r <= 0x9FFF {
				cjk = true
			}
		}
		isCode := codeRE.MatchString(c.Text)
		// Prose excludes the golden set's stress lines (a 900-letter run,
		// "aaaa…"): real prose has no 40-byte words.
		longWord := false
		for _, w := range strings.Fields(c.Text) {
			longWord = longWord || len(w) > 40
		}
		switch {
		case kind == "prose" && ascii && !isCode && !longWord,
			kind == "code" && isCode,
			kind == "cjk" && cjk:
			parts = append(parts, c.Text)
		}
	}
	if len(parts) == 0 {
		tb.Fatalf("no %s texts", kind)
	}
	return parts
}

func benchEncode(b *testing.B, tok *Tokenizer, text string) {
	b.Helper()
	b.ReportAllocs()
	b.SetBytes(int64(len(text)))
	tokens := 0
	for b.Loop() {
		tokens += len(tok.Encode(text, false))
	}
	b.ReportMetric(float64(tokens)/b.Elapsed().Seconds(), "tokens/s")
}

// withCache returns a Tokenizer sharing tok's parts but with its own BPE
// model value, whose cache the caller sets (nil: no word cache).
func withCache(tok *Tokenizer) (*Tokenizer, *bpe) {
	m := *tok.model
	return &Tokenizer{cfg: tok.cfg, norm: tok.norm, pre: tok.pre, scanDigits: tok.scanDigits, model: &m, added: tok.added, post: tok.post, dec: tok.dec}, &m
}

// benchEncodeCold encodes text once per op from a new, empty word cache: a
// word's first occurrence in text is merged from bytes (and cached), only
// its repeats within text hit. Making the cache is part of the op
// (BenchmarkNewWordCache: 4-7 us, under 3% of the prose op), which keeps
// the timer running. The ids are checked against tok's first;
// cached-words/op is how many words an op merged and cached (the cache's
// size after it).
func benchEncodeCold(b *testing.B, tok *Tokenizer, text string) {
	b.Helper()
	cold, m := withCache(tok)
	m.cache = newWordCache()
	if got, want := cold.Encode(text, false), tok.Encode(text, false); !slices.Equal(got, want) {
		b.Fatal("a cold cache changes the ids")
	}
	words := m.cache.len()
	b.ReportAllocs()
	b.SetBytes(int64(len(text)))
	tokens := 0
	for b.Loop() {
		m.cache = newWordCache()
		tokens += len(cold.Encode(text, false))
	}
	b.ReportMetric(float64(tokens)/b.Elapsed().Seconds(), "tokens/s")
	b.ReportMetric(float64(words), "cached-words/op")
}

// BenchmarkEncode encodes each kind's distinct texts joined into one
// (prose: 250 texts, 4.7 KB; code: 62, 30 KB; CJK: 25, 27 KB) per op, the
// same text in every variant: cache=warm with one word cache for all ops,
// which holds every word after the first, so every later op hits for every
// pre-token of up to 64 bytes; cache=cold from a new, empty cache per op
// (benchEncodeCold); cache=off with the cache bypassed (every pre-token
// merged from bytes).
func BenchmarkEncode(b *testing.B) {
	tok := loadQwen(b)
	for _, kind := range []string{"prose", "code", "cjk"} {
		text := strings.Join(corpusTexts(b, kind), "\n")
		b.Run("text="+kind+"/cache=warm", func(b *testing.B) { benchEncode(b, tok, text) })
		b.Run("text="+kind+"/cache=cold", func(b *testing.B) { benchEncodeCold(b, tok, text) })
		b.Run("text="+kind+"/cache=off", func(b *testing.B) {
			off, m := withCache(tok)
			m.cache = nil
			benchEncode(b, off, text)
		})
	}
}

// BenchmarkNewWordCache is what benchEncodeCold adds per text besides
// encoding: making an empty word cache.
func BenchmarkNewWordCache(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		_ = newWordCache()
	}
}

// worstCases are the inputs the issue bounds ("tens of milliseconds"),
// plus other long single pre-tokens.
var worstCases = []struct{ name, text string }{
	{"cjk=50000", strings.Repeat("中", 50000)},
	{"spaces=100000", strings.Repeat(" ", 100000)},
	{"digits=30000", strings.Repeat("7", 30000)},
	{"letters=100000", strings.Repeat("a", 100000)},
	{"newlines=100000", strings.Repeat("\n", 100000)},
	{"punct=100000", strings.Repeat("-=", 50000)},
	{"space-letter=100000", strings.Repeat(" a", 50000)},
}

func BenchmarkWorstCase(b *testing.B) {
	tok := loadQwen(b)
	for _, w := range worstCases {
		b.Run(w.name, func(b *testing.B) { benchEncode(b, tok, w.text) })
	}
}
