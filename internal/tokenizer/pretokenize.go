package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
)

// preTokenizer splits normalized text into pre-tokens. split appends the
// pre-tokens of s to dst and returns it; empty pre-tokens are dropped, as
// Hugging Face's PreTokenizedString does.
type preTokenizer interface {
	split(dst []string, s string) []string
}

// pipeline is the compiled pre_tokenizer: steps applied in order, each to
// every piece the previous step produced. The ByteLevel byte-to-char
// mapping itself is implicit: kvrouter runs BPE on raw bytes.
type pipeline []preTokenizer

// parsePreTokenizer decodes "pre_tokenizer". Byte-level BPE needs a
// ByteLevel step, and it must come last: a Split after ByteLevel would see
// byte-level characters, which this package does not model.
func parsePreTokenizer(raw json.RawMessage) (pipeline, error) {
	if isNull(raw) {
		return nil, errors.New("missing; byte-level BPE needs a ByteLevel pre-tokenizer")
	}
	var p pipeline
	sawByteLevel, err := appendPreTokenizer(&p, raw, "")
	if err != nil {
		return nil, err
	}
	if !sawByteLevel {
		return nil, errors.New("no ByteLevel step; only byte-level BPE is supported")
	}
	return p, nil
}

// appendPreTokenizer appends the steps of one pre-tokenizer object and
// reports whether it ended with ByteLevel.
func appendPreTokenizer(p *pipeline, raw json.RawMessage, where string) (bool, error) {
	var t typed
	if err := json.Unmarshal(raw, &t); err != nil {
		return false, fmt.Errorf("%s%w", where, err)
	}
	switch t.Type {
	case "Sequence":
		var s struct {
			PreTokenizers []json.RawMessage `json:"pretokenizers"`
		}
		if err := json.Unmarshal(raw, &s); err != nil {
			return false, fmt.Errorf("%sSequence: %w", where, err)
		}
		last := false
		for i, r := range s.PreTokenizers {
			if last {
				return false, fmt.Errorf("%sSequence[%d]: a step after ByteLevel is not supported", where, i)
			}
			var err error
			if last, err = appendPreTokenizer(p, r, fmt.Sprintf("%sSequence[%d]: ", where, i)); err != nil {
				return false, err
			}
		}
		return last, nil
	case "ByteLevel":
		var b struct {
			AddPrefixSpace bool  `json:"add_prefix_space"`
			UseRegex       *bool `json:"use_regex"`
		}
		if err := json.Unmarshal(raw, &b); err != nil {
			return false, fmt.Errorf("%sByteLevel: %w", where, err)
		}
		// use_regex defaults to true in Hugging Face tokenizers.
		useRegex := b.UseRegex == nil || *b.UseRegex
		if b.AddPrefixSpace || useRegex {
			*p = append(*p, byteLevelSplit{addPrefixSpace: b.AddPrefixSpace, useRegex: useRegex})
		}
		return true, nil
	case "Split":
		s, err := parseSplit(raw)
		if err != nil {
			return false, fmt.Errorf("%sSplit: %w", where, err)
		}
		*p = append(*p, s)
		return false, nil
	default:
		return false, fmt.Errorf("%stype %q not supported", where, t.Type)
	}
}

// cl100kDigits is the scanner's maxDigits when the pipeline is exactly
// one Split that scanCL100K runs (the Qwen or Llama-3 pattern, Isolated,
// not inverted), else 0.
func (p pipeline) cl100kDigits() int {
	if len(p) != 1 {
		return 0
	}
	if s, ok := p[0].(*splitStep); ok {
		return s.digits
	}
	return 0
}

func (p pipeline) split(dst []string, s string) []string {
	if len(p) == 0 {
		if s != "" {
			dst = append(dst, s)
		}
		return dst
	}
	if len(p) == 1 {
		return p[0].split(dst, s)
	}
	cur := p[0].split(nil, s)
	for i, step := range p[1:] {
		if i == len(p)-2 {
			for _, piece := range cur {
				dst = step.split(dst, piece)
			}
			return dst
		}
		var next []string
		for _, piece := range cur {
			next = step.split(next, piece)
		}
		cur = next
	}
	return dst
}

// gpt2Pattern is the regex Hugging Face's ByteLevel pre-tokenizer applies
// when use_regex is true.
const gpt2Pattern = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`

// byteLevelSplit is the splitting part of the ByteLevel pre-tokenizer: an
// optional prefix space per piece, then the GPT-2 regex (Isolated).
type byteLevelSplit struct {
	addPrefixSpace bool
	useRegex       bool
}

func (b byteLevelSplit) split(dst []string, s string) []string {
	if b.addPrefixSpace && !strings.HasPrefix(s, " ") {
		s = " " + s
	}
	if !b.useRegex {
		if s != "" {
			dst = append(dst, s)
		}
		return dst
	}
	for i := 0; i < len(s); {
		j := scanGPT2(s, i)
		dst = append(dst, s[i:j])
		i = j
	}
	return dst
}

// behavior is Hugging Face's SplitDelimiterBehavior.
type behavior int

const (
	isolated behavior = iota
	removed
	mergedWithPrevious
	mergedWithNext
	contiguous
)

var behaviors = map[string]behavior{
	"Isolated": isolated, "Removed": removed, "MergedWithPrevious": mergedWithPrevious,
	"MergedWithNext": mergedWithNext, "Contiguous": contiguous,
}

// matcher finds the non-overlapping matches of a Split pattern, left to
// right, appending [start, end) byte spans to dst.
type matcher interface {
	find(dst []span, s string) []span
}

type span struct{ start, end int }

// splitStep is the Split pre-tokenizer.
type splitStep struct {
	m        matcher
	behavior behavior
	invert   bool
	// scan, when set, is a hand-written equivalent of the regex that
	// yields the end of the match starting at i; with behavior Isolated
	// and no invert, pieces are exactly the matches (the pattern matches
	// every character).
	scan func(s string, i int) int
	// digits, when not 0, says scan is the Qwen (1) or Llama-3 (3)
	// pattern's scanner, which split then calls directly.
	digits int
}

func parseSplit(raw json.RawMessage) (*splitStep, error) {
	var j struct {
		Pattern struct {
			String *string `json:"String"`
			Regex  *string `json:"Regex"`
		} `json:"pattern"`
		Behavior string `json:"behavior"`
		Invert   bool   `json:"invert"`
	}
	if err := json.Unmarshal(raw, &j); err != nil {
		return nil, err
	}
	b, ok := behaviors[j.Behavior]
	if !ok {
		return nil, fmt.Errorf("behavior %q not supported", j.Behavior)
	}
	s := &splitStep{behavior: b, invert: j.Invert}
	switch {
	case j.Pattern.String != nil:
		s.m = literalMatcher(*j.Pattern.String)
	case j.Pattern.Regex != nil:
		re, err := compileRegex(*j.Pattern.Regex)
		if err != nil {
			return nil, err
		}
		s.m = re
		if b == isolated && !j.Invert {
			s.scan = scannerFor(*j.Pattern.Regex)
			s.digits = cl100kDigits(*j.Pattern.Regex)
		}
	default:
		return nil, errors.New("pattern must be {\"String\": ...} or {\"Regex\": ...}")
	}
	return s, nil
}

func (p *splitStep) split(dst []string, s string) []string {
	if d := p.digits; d != 0 {
		for i := 0; i < len(s); {
			j := scanCL100KFast(s, i, d)
			if j < 0 {
				j = scanCL100K(s, i, d)
			}
			dst = append(dst, s[i:j])
			i = j
		}
		return dst
	}
	if p.scan != nil {
		for i := 0; i < len(s); {
			j := p.scan(s, i)
			dst = append(dst, s[i:j])
			i = j
		}
		return dst
	}
	return p.splitGeneric(dst, s)
}

// splitGeneric follows NormalizedString::split: matches and the gaps
// between them cover s; the behavior decides how they become pieces.
func (p *splitStep) splitGeneric(dst []string, s string) []string {
	type seg struct {
		span
		match bool
	}
	var segs []seg
	prev := 0
	for _, m := range p.m.find(nil, s) {
		if m.start > prev {
			segs = append(segs, seg{span{prev, m.start}, p.invert})
		}
		segs = append(segs, seg{m, !p.invert})
		prev = m.end
	}
	if prev < len(s) {
		segs = append(segs, seg{span{prev, len(s)}, p.invert})
	}
	var out []seg
	switch p.behavior {
	case isolated:
		for _, g := range segs {
			out = append(out, seg{g.span, false})
		}
	case removed:
		out = segs
	case contiguous:
		prevMatch := false
		for _, g := range segs {
			if g.match == prevMatch && len(out) > 0 {
				out[len(out)-1].end = g.end
			} else {
				out = append(out, seg{g.span, false})
			}
			prevMatch = g.match
		}
	case mergedWithPrevious:
		prevMatch := false
		for _, g := range segs {
			if g.match && !prevMatch && len(out) > 0 {
				out[len(out)-1].end = g.end
			} else {
				out = append(out, seg{g.span, false})
			}
			prevMatch = g.match
		}
	case mergedWithNext:
		prevMatch := false
		for k := len(segs) - 1; k >= 0; k-- {
			g := segs[k]
			if g.match && !prevMatch && len(out) > 0 {
				out[len(out)-1].start = g.start
			} else {
				out = append(out, seg{g.span, false})
			}
			prevMatch = g.match
		}
		for a, b := 0, len(out)-1; a < b; a, b = a+1, b-1 {
			out[a], out[b] = out[b], out[a]
		}
	}
	for _, g := range out {
		if !g.match && g.end > g.start {
			dst = append(dst, s[g.start:g.end])
		}
	}
	return dst
}

// literalMatcher matches a fixed string; an empty one matches nothing.
type literalMatcher string

func (l literalMatcher) find(dst []span, s string) []span {
	if l == "" {
		return dst
	}
	for off := 0; ; {
		k := strings.Index(s[off:], string(l))
		if k < 0 {
			return dst
		}
		dst = append(dst, span{off + k, off + k + len(l)})
		off += k + len(l)
	}
}

// regexMatcher runs a pattern with regexp2 in its default (.NET-like)
// mode, whose \s is Unicode White_Space like Oniguruma's (the RE2 mode's
// \s is ASCII-only and the ECMAScript mode's adds U+FEFF and drops U+0085,
// both unlike Hugging Face's Oniguruma).
type regexMatcher struct{ re *regexp2.Regexp }

func compileRegex(pattern string) (*regexMatcher, error) {
	re, err := regexp2.Compile(pattern, regexp2.None)
	if err != nil {
		return nil, fmt.Errorf("regex %q: %w", pattern, err)
	}
	return &regexMatcher{re}, nil
}

func (r *regexMatcher) find(dst []span, s string) []span {
	runes := []rune(s)
	// byteAt[k] is the byte offset of rune k (s is valid UTF-8).
	byteAt := make([]int, len(runes)+1)
	off := 0
	for k, c := range runes {
		byteAt[k] = off
		off += utf8.RuneLen(c)
	}
	byteAt[len(runes)] = off
	m, err := r.re.FindRunesMatch(runes)
	for err == nil && m != nil {
		if m.Length > 0 {
			dst = append(dst, span{byteAt[m.Index], byteAt[m.Index+m.Length]})
		}
		m, err = r.re.FindNextMatch(m)
	}
	return dst
}
