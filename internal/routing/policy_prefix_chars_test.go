package routing

import (
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"
)

// TestPrefixCharsCountsCharacters: chunks are 128 characters (code points,
// as production-stack's Python str slices), not 128 bytes. Two prompts
// sharing 100 three-byte characters (300 bytes) share no whole 128-character
// chunk, so the second is "no_match"; cut in bytes they would share two
// 128-byte chunks and match. Sharing 200 characters they share one chunk,
// whose matched length is 128 characters.
func TestPrefixCharsCountsCharacters(t *testing.T) {
	cands := []Candidate{{Name: "a"}, {Name: "b"}, {Name: "c"}}
	cjk := strings.Repeat("日本語", 100) // 300 characters, 900 bytes
	p, _ := NewPolicy("prefix_chars", seeded(1))
	p.Pick(&Request{Text: cjk[:300] + "xyz"}, cands) // 100 characters shared below
	if d := p.Pick(&Request{Text: cjk[:300] + "abc"}, cands); d.Reason != "no_match" {
		t.Fatalf("100 shared characters matched: %s %+v", d.Reason, d.Terms)
	}

	p, _ = NewPolicy("prefix_chars", seeded(1))
	first := p.Pick(&Request{Text: cjk[:600] + "xyz"}, cands) // 200 characters shared below
	d := p.Pick(&Request{Text: cjk[:600] + "abc"}, cands)
	if d.Reason != "prefix" || d.Name != first.Name || d.Chosen().Cost != -128 {
		t.Fatalf("200 shared characters: %s to %s cost %v, want prefix to %s cost -128", d.Reason, d.Name, d.Chosen().Cost, first.Name)
	}
	// The whole prompt matched: its last, shorter chunk counts its characters.
	if d := p.(Evaluator).Evaluate(&Request{Text: cjk[:600] + "xyz"}, cands); d.Chosen().Cost != -203 {
		t.Fatalf("full match cost %v, want -203", d.Chosen().Cost)
	}
}

// TestChunkEnd: on valid UTF-8 chunkEnd agrees with counting code points
// one by one (utf8.DecodeRuneInString) on random mixes of ASCII and
// multi-byte characters, at every character offset; on invalid bytes its
// chunks still tile the string, each advancing.
func TestChunkEnd(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	pieces := []string{"a", "b", "0123456789", "é", "日", "🙂", "\n"}
	for trial := range 300 {
		var sb strings.Builder
		for range rng.IntN(60) {
			sb.WriteString(pieces[rng.IntN(len(pieces))])
		}
		s := sb.String()
		n := 1 + rng.IntN(20)
		for off := 0; off <= len(s); off++ {
			if off < len(s) && !utf8.RuneStart(s[off]) {
				continue
			}
			wantEnd, wantChars := off, 0
			for wantEnd < len(s) && wantChars < n {
				_, size := utf8.DecodeRuneInString(s[wantEnd:])
				wantEnd += size
				wantChars++
			}
			end, chars := chunkEnd(s, off, n)
			if end != wantEnd || chars != wantChars {
				t.Fatalf("trial %d: chunkEnd(%q, %d, %d) = %d, %d; want %d, %d", trial, s, off, n, end, chars, wantEnd, wantChars)
			}
		}
	}
	for _, s := range []string{"\xff\xfe\x80\x80abc", "\x80\x80\x80", "日\xe6\x97本", strings.Repeat("\xe6", 40)} {
		for n := 1; n <= 5; n++ {
			for off := 0; off < len(s); {
				end, chars := chunkEnd(s, off, n)
				if end <= off || end > len(s) || chars < 1 || chars > n {
					t.Fatalf("chunkEnd(%q, %d, %d) = %d, %d", s, off, n, end, chars)
				}
				off = end
			}
		}
	}
}

// TestTokenText: 4 ASCII characters per token, distinct for distinct ids
// below 2^28, so a 128-character chunk is 32 tokens: prompts sharing 64
// tokens match two chunks.
func TestTokenText(t *testing.T) {
	ids := []uint32{0, 1, 127, 128, 1000, 66535, 151642, 1<<28 - 1}
	seen := map[string]uint32{}
	for _, id := range ids {
		s := TokenText([]uint32{id})
		if len(s) != 4 || utf8.RuneCountInString(s) != 4 {
			t.Fatalf("id %d: %q is not 4 ASCII characters", id, s)
		}
		for i := range len(s) {
			if s[i] >= utf8.RuneSelf {
				t.Fatalf("id %d: %q not ASCII", id, s)
			}
		}
		if other, dup := seen[s]; dup {
			t.Fatalf("ids %d and %d render alike", other, id)
		}
		seen[s] = id
	}
	if got := string(AppendTokenText([]byte("x"), []uint32{1000, 2000})); got != "x"+TokenText([]uint32{1000, 2000}) {
		t.Fatalf("AppendTokenText %q", got)
	}
	shared := make([]uint32, 64)
	for i := range shared {
		shared[i] = uint32(1000 + 7*i)
	}
	cands := []Candidate{{Name: "a"}, {Name: "b"}, {Name: "c"}}
	p, _ := NewPolicy("prefix_chars", seeded(2))
	first := p.Pick(&Request{Text: TokenText(append(shared, 1))}, cands)
	d := p.Pick(&Request{Text: TokenText(append(shared, 2))}, cands)
	if d.Reason != "prefix" || d.Name != first.Name || d.Chosen().Cost != -256 {
		t.Fatalf("64 shared tokens: %s to %s cost %v, want prefix to %s cost -256", d.Reason, d.Name, d.Chosen().Cost, first.Name)
	}
}

// BenchmarkPrefixChars: Pick (match, then insert) of a 32,768-character
// prompt whose first half is shared with the trie's prompts, 8 candidates:
// ASCII (one byte per character, the 8-byte fast path) and CJK (three
// bytes per character, decoded).
//
//	go test -run '^$' -bench PrefixChars -benchtime 2000x ./internal/routing/
func BenchmarkPrefixChars(b *testing.B) {
	cands := make([]Candidate, 8)
	for i := range cands {
		cands[i] = Candidate{Name: string(rune('a' + i))}
	}
	for _, tc := range []struct{ name, unit string }{{"ascii", "abcdefgh"}, {"cjk", "日本語の文章です"}} {
		b.Run(tc.name, func(b *testing.B) {
			shared := strings.Repeat(tc.unit, 16384/8)
			texts := make([]string, 64)
			for i := range texts {
				texts[i] = shared + strings.Repeat(string(rune('A'+i)), 16384)
			}
			p, _ := NewPolicy("prefix_chars", seeded(3))
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				p.Pick(&Request{Text: texts[i%len(texts)]}, cands)
				i++
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(i)/32768, "ns/char")
		})
	}
}
