package tokenizer

import (
	"fmt"
	"strings"
	"unicode"
)

// addedVocab finds added tokens in text the way Hugging Face's
// AddedVocabulary does: non-normalized tokens in the raw text, normalized
// ones (their content normalized too) in the normalized text, each set
// matched leftmost-longest and non-overlapping, then filtered and widened
// by the single_word, lstrip and rstrip flags.
type addedVocab struct {
	raw, normalized tokenSet
	byID            map[uint32]addedTokenJSON
}

// tokenSet is one matching set: a byte trie over token contents.
type tokenSet struct {
	first [256]bool        // bytes some token starts with
	only  int              // the one byte every token starts with, or -1
	edges map[uint32]int32 // node<<8 | byte -> child node
	term  []int32          // node -> index into toks, or -1
	toks  []addedTokenJSON // matched token (content is the pattern)
}

// newAddedVocab registers the added tokens. Like Hugging Face, it ignores
// the "id" written in the JSON and assigns ids as AddedVocabulary does
// when the tokens are added one by one in file order: the id of an equal
// vocab entry, else the vocab size for the first new token, else one past
// the largest id so far. Real tokenizer files write exactly those ids.
func newAddedVocab(in []addedTokenJSON, n normalizer, model *bpe) (*addedVocab, error) {
	a := &addedVocab{byID: make(map[uint32]addedTokenJSON, len(in))}
	a.raw.init()
	a.normalized.init()
	list := make([]addedTokenJSON, 0, len(in))
	ids := make(map[string]uint32, len(in))
	var maxID uint32
	for i, tok := range in {
		if tok.Content == "" {
			return nil, fmt.Errorf("[%d] (id %d): empty content", i, tok.ID)
		}
		if _, dup := ids[tok.Content]; dup {
			return nil, fmt.Errorf("[%d] (id %d): duplicate content %q not supported", i, tok.ID, tok.Content)
		}
		id, ok := model.tokenID(tok.Content)
		switch {
		case ok:
		case len(ids) == 0 || maxID < model.size && model.size != 0:
			id = model.size
		default:
			id = maxID + 1
		}
		if len(ids) == 0 || id > maxID {
			maxID = id
		}
		ids[tok.Content] = id
		tok.ID = id
		a.byID[id] = tok
		list = append(list, tok)
	}
	// Hugging Face orders its patterns special tokens first; with
	// leftmost-longest matching and distinct contents the order cannot
	// change a match, except between normalized tokens whose normalized
	// forms collide, where the first listed wins.
	for _, special := range []bool{true, false} {
		for _, tok := range list {
			if tok.Special != special {
				continue
			}
			if !tok.Normalized {
				a.raw.add(tok.Content, tok)
				continue
			}
			pat := tok.Content
			if n != nil {
				pat = n.normalize(pat)
			}
			if pat != "" {
				a.normalized.add(pat, tok)
			}
		}
	}
	return a, nil
}

func (s *tokenSet) init() {
	s.edges = make(map[uint32]int32)
	s.term = []int32{-1}
	s.only = -1
}

func (s *tokenSet) add(pattern string, tok addedTokenJSON) {
	switch {
	case s.empty() && s.only == -1 && !s.first[pattern[0]]:
		s.only = int(pattern[0])
	case s.only != int(pattern[0]):
		s.only = -2 // several first bytes
	}
	s.first[pattern[0]] = true
	node := int32(0)
	for i := 0; i < len(pattern); i++ {
		k := uint32(node)<<8 | uint32(pattern[i])
		child, ok := s.edges[k]
		if !ok {
			child = int32(len(s.term))
			s.term = append(s.term, -1)
			s.edges[k] = child
		}
		node = child
	}
	if s.term[node] < 0 { // first pattern wins on collision
		s.term[node] = int32(len(s.toks))
		s.toks = append(s.toks, tok)
	}
}

func (s *tokenSet) empty() bool { return len(s.toks) == 0 }

// longestAt returns the longest token matching at s[i:], or -1.
func (s *tokenSet) longestAt(text string, i int) (tok int32, end int) {
	tok, end = -1, i
	node := int32(0)
	for j := i; j < len(text); j++ {
		child, ok := s.edges[uint32(node)<<8|uint32(text[j])]
		if !ok {
			break
		}
		node = child
		if t := s.term[node]; t >= 0 {
			tok, end = t, j+1
		}
	}
	return tok, end
}

// segment is a piece of text: an added token (id >= 0) or text to encode.
type segment struct {
	start, end int
	id         int64
}

// split appends the segments of text to dst: added tokens found by set,
// and the text between them (non-empty only), as AddedVocabulary's
// find_matches does, including its handling of lstrip/rstrip overlap.
func (s *tokenSet) split(dst []segment, text string) []segment {
	if s.empty() {
		if text != "" {
			dst = append(dst, segment{0, len(text), -1})
		}
		return dst
	}
	prev := 0
	for i := 0; i < len(text); {
		if s.only >= 0 && text[i] != byte(s.only) {
			// One first byte (e.g. '<' for Qwen3's tokens): jump to it.
			j := strings.IndexByte(text[i:], byte(s.only))
			if j < 0 {
				break
			}
			i += j
		}
		if !s.first[text[i]] {
			i++
			continue
		}
		t, stop := s.longestAt(text, i)
		if t < 0 {
			i++
			continue
		}
		tok := s.toks[t]
		start := i
		i = stop // the match is consumed even if single_word rejects it
		if tok.SingleWord {
			if start > 0 && endsWithWord(text[:start]) || stop < len(text) && startsWithWord(text[stop:]) {
				continue
			}
		}
		if tok.LStrip {
			start = max(trailingSpaceStart(text[:start]), prev)
		}
		if tok.RStrip {
			stop += leadingSpaceLen(text[stop:])
		}
		if prev < start {
			dst = append(dst, segment{prev, start, -1})
		}
		dst = append(dst, segment{start, stop, int64(tok.ID)})
		prev = stop
	}
	if prev < len(text) {
		dst = append(dst, segment{prev, len(text), -1})
	}
	return dst
}

// isWordRune is Rust regex's Unicode \w: Alphabetic, M, Nd, Pc and
// Join_Control.
func isWordRune(r rune) bool {
	return r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsMark(r) ||
		unicode.Is(unicode.Nl, r) || unicode.Is(unicode.Other_Alphabetic, r) ||
		unicode.Is(unicode.Pc, r) || r == 0x200C || r == 0x200D
}

func endsWithWord(s string) bool {
	for i := len(s) - 1; i >= 0; i-- {
		if s[i]&0xC0 != 0x80 {
			r, _ := at(s, i)
			return isWordRune(r)
		}
	}
	return false
}

func startsWithWord(s string) bool {
	if s == "" {
		return false
	}
	r, _ := at(s, 0)
	return isWordRune(r)
}

// trailingSpaceStart is where the trailing White_Space run of s begins.
func trailingSpaceStart(s string) int {
	i := len(s)
	for i > 0 {
		j := i - 1
		for j > 0 && s[j]&0xC0 == 0x80 {
			j--
		}
		r, _ := at(s, j)
		if !unicode.IsSpace(r) {
			break
		}
		i = j
	}
	return i
}

// leadingSpaceLen is the byte length of the leading White_Space run of s.
func leadingSpaceLen(s string) int {
	i := 0
	for i < len(s) {
		r, n := at(s, i)
		if !unicode.IsSpace(r) {
			break
		}
		i += n
	}
	return i
}
