package tokenizer

import (
	"regexp"
	"strings"
	"testing"
)

// Benchmarks report tokens/s per core (one goroutine) on prose, code and
// CJK built from the golden texts, and the worst-case inputs the issue
// bounds. Run:
//
//	go test -run '^$' -bench . -benchtime 1s -count 1 ./internal/tokenizer/

var codeRE = regexp.MustCompile(`[{};=]|def |func |return|class |import `)

// corpus joins the encode.jsonl texts of one kind into about size bytes.
func corpus(tb testing.TB, kind string, size int) string {
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
	var b strings.Builder
	for i := 0; b.Len() < size; i++ {
		if i > 0 {
			b.WriteString("\n")
		}
		b.WriteString(parts[i%len(parts)])
	}
	return b.String()
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

func BenchmarkEncode(b *testing.B) {
	tok := loadQwen(b)
	for _, kind := range []string{"prose", "code", "cjk"} {
		text := corpus(b, kind, 256<<10)
		b.Run("text="+kind, func(b *testing.B) { benchEncode(b, tok, text) })
	}
	// The same prose with the word cache bypassed: every pre-token is
	// merged from bytes (the cold-cache cost).
	text := corpus(b, "prose", 256<<10)
	b.Run("text=prose/cache=off", func(b *testing.B) {
		cold := *tok.model
		cold.cache = nil
		t2 := &Tokenizer{cfg: tok.cfg, norm: tok.norm, pre: tok.pre, model: &cold, added: tok.added, post: tok.post, dec: tok.dec}
		benchEncode(b, t2, text)
	})
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
