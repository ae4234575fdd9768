package tokenizer

import (
	"slices"
	"testing"
)

func testSet(toks ...addedTokenJSON) *tokenSet {
	var s tokenSet
	s.init()
	for _, t := range toks {
		s.add(t.Content, t)
	}
	return &s
}

// TestTokenSetSplit pins Hugging Face's AddedVocabulary::find_matches
// semantics: leftmost-longest, a single_word rejection still consumes its
// match, lstrip never reaches into the previous match, and rstrip may
// overlap a following match (both splits are kept, as in HF).
func TestTokenSetSplit(t *testing.T) {
	seg := func(start, end int, id int64) segment { return segment{start, end, id} }
	for _, c := range []struct {
		name string
		set  *tokenSet
		text string
		want []segment
	}{
		{"longest", testSet(addedTokenJSON{ID: 1, Content: "<a>"}, addedTokenJSON{ID: 2, Content: "<a><b>"}),
			"x<a><b><a>", []segment{seg(0, 1, -1), seg(1, 7, 2), seg(7, 10, 1)}},
		{"none", testSet(addedTokenJSON{ID: 1, Content: "<a>"}), "plain", []segment{seg(0, 5, -1)}},
		{"empty text", testSet(addedTokenJSON{ID: 1, Content: "<a>"}), "", nil},
		{"single_word ok", testSet(addedTokenJSON{ID: 1, Content: "go", SingleWord: true}), "a go!", []segment{seg(0, 2, -1), seg(2, 4, 1), seg(4, 5, -1)}},
		{"single_word rejected", testSet(addedTokenJSON{ID: 1, Content: "go", SingleWord: true}), "ago go_", []segment{seg(0, 7, -1)}},
		{"single_word consumes", testSet(addedTokenJSON{ID: 1, Content: "ab", SingleWord: true}, addedTokenJSON{ID: 2, Content: "b c"}),
			"xab c", []segment{seg(0, 5, -1)}},
		{"lstrip", testSet(addedTokenJSON{ID: 1, Content: "<m>", LStrip: true}), "a \t<m>b", []segment{seg(0, 1, -1), seg(1, 6, 1), seg(6, 7, -1)}},
		{"lstrip stops at previous", testSet(addedTokenJSON{ID: 1, Content: "<m>", LStrip: true, RStrip: true}),
			"<m>  <m>", []segment{seg(0, 5, 1), seg(5, 8, 1)}},
		{"rstrip", testSet(addedTokenJSON{ID: 1, Content: "<m>", RStrip: true}), "<m>\u3000 x", []segment{seg(0, 7, 1), seg(7, 8, -1)}},
		{"rstrip overlaps next", testSet(addedTokenJSON{ID: 1, Content: "<m>", RStrip: true}, addedTokenJSON{ID: 2, Content: " <n>"}),
			"<m> <n>", []segment{seg(0, 4, 1), seg(3, 7, 2)}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := c.set.split(nil, c.text); !slices.Equal(got, c.want) {
				t.Errorf("split(%q) = %v, want %v", c.text, got, c.want)
			}
		})
	}
}

func TestWordBoundaries(t *testing.T) {
	for _, c := range []struct {
		r    rune
		want bool
	}{{'a', true}, {'_', true}, {'7', true}, {'中', true}, {0x0301, true}, {0x200D, true}, {'Ⅻ', true}, {' ', false}, {'-', false}, {'½', false}} {
		if got := isWordRune(c.r); got != c.want {
			t.Errorf("isWordRune(%q) = %v", c.r, got)
		}
	}
	if got := trailingSpaceStart("ab \u3000\t"); got != 2 {
		t.Errorf("trailingSpaceStart = %d", got)
	}
	if got := leadingSpaceLen("\u0085 x"); got != 3 {
		t.Errorf("leadingSpaceLen = %d", got)
	}
}
