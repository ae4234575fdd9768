package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// normalizer rewrites text before pre-tokenization, as a Hugging Face
// normalizer does (offsets are not tracked: kvrouter needs ids only).
type normalizer interface {
	normalize(s string) string
}

// parseNormalizer decodes the "normalizer" object; nil means none.
func parseNormalizer(raw json.RawMessage) (normalizer, error) {
	if isNull(raw) {
		return nil, nil
	}
	var t typed
	if err := json.Unmarshal(raw, &t); err != nil {
		return nil, err
	}
	switch t.Type {
	case "NFC":
		return unicodeNorm{norm.NFC}, nil
	case "NFD":
		return unicodeNorm{norm.NFD}, nil
	case "NFKC":
		return unicodeNorm{norm.NFKC}, nil
	case "NFKD":
		return unicodeNorm{norm.NFKD}, nil
	case "Sequence":
		var s struct {
			Normalizers []json.RawMessage `json:"normalizers"`
		}
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, fmt.Errorf("%s: %w", t.Type, err)
		}
		var seq seqNorm
		for i, r := range s.Normalizers {
			n, err := parseNormalizer(r)
			if err != nil {
				return nil, fmt.Errorf("%s[%d]: %w", t.Type, i, err)
			}
			if n != nil {
				seq = append(seq, n)
			}
		}
		return seq, nil
	case "Prepend":
		var p struct {
			Prepend string `json:"prepend"`
		}
		if err := json.Unmarshal(raw, &p); err != nil {
			return nil, fmt.Errorf("%s: %w", t.Type, err)
		}
		return prependNorm(p.Prepend), nil
	case "Replace":
		var p struct {
			Pattern struct {
				String *string `json:"String"`
				Regex  *string `json:"Regex"`
			} `json:"pattern"`
			Content string `json:"content"`
		}
		if err := json.Unmarshal(raw, &p); err != nil {
			return nil, fmt.Errorf("%s: %w", t.Type, err)
		}
		if p.Pattern.String == nil {
			return nil, fmt.Errorf("%s: only a String pattern is supported", t.Type)
		}
		return replaceNorm{from: *p.Pattern.String, to: p.Content}, nil
	case "Strip":
		var p struct {
			Left  bool `json:"strip_left"`
			Right bool `json:"strip_right"`
		}
		if err := json.Unmarshal(raw, &p); err != nil {
			return nil, fmt.Errorf("%s: %w", t.Type, err)
		}
		return stripNorm{left: p.Left, right: p.Right}, nil
	default:
		return nil, fmt.Errorf("type %q not supported", t.Type)
	}
}

type seqNorm []normalizer

func (s seqNorm) normalize(x string) string {
	for _, n := range s {
		x = n.normalize(x)
	}
	return x
}

// prependNorm prepends its string to non-empty input.
type prependNorm string

func (p prependNorm) normalize(s string) string {
	if s == "" {
		return s
	}
	return string(p) + s
}

// replaceNorm replaces every non-overlapping occurrence, left to right.
type replaceNorm struct{ from, to string }

func (r replaceNorm) normalize(s string) string {
	if r.from == "" {
		return s
	}
	return strings.ReplaceAll(s, r.from, r.to)
}

// stripNorm trims Unicode White_Space (Rust char::is_whitespace).
type stripNorm struct{ left, right bool }

func (p stripNorm) normalize(s string) string {
	if p.left {
		s = strings.TrimLeftFunc(s, unicode.IsSpace)
	}
	if p.right {
		s = strings.TrimRightFunc(s, unicode.IsSpace)
	}
	return s
}

// unicodeNorm applies a Unicode normalization form the way Hugging Face
// tokenizers does. HF uses the unicode-normalization-alignments crate,
// whose tables are Unicode 9.0; golang.org/x/text has current tables. Code
// points assigned after Unicode 9.0 were, to HF, unassigned: canonical
// combining class 0, no decomposition, no composition. Every code point
// whose normalization properties differ between the two versions is in
// unicode9Inert; unicodeNorm passes those through untouched and
// normalizes the text between them separately, which is exactly Unicode
// 9.0 normalization: an inert starter blocks reordering and composition
// across it, and by Unicode's normalization stability policy text made of
// code points assigned in 9.0 normalizes the same in both versions.
type unicodeNorm struct{ form norm.Form }

func (u unicodeNorm) normalize(s string) string {
	// ASCII is normal in every form, and an ASCII character neither
	// decomposes nor reorders nor composes with what precedes it, so s is
	// normal when what follows its ASCII prefix, from the prefix's last
	// character on (which may compose with what follows), is.
	k := asciiPrefix(s)
	if k == len(s) {
		return s
	}
	if u.form.IsNormalString(s[max(k-1, 0):]) {
		// Normal under current Unicode implies normal under 9.0: the 9.0
		// rules only do less (inert code points), never more.
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + len(s)/4)
	start := 0
	for i, r := range s {
		if r < 0x07FD || !isUnicode9Inert(r) {
			continue
		}
		b.WriteString(u.form.String(s[start:i]))
		n := utf8.RuneLen(r)
		b.WriteString(s[i : i+n])
		start = i + n
	}
	b.WriteString(u.form.String(s[start:]))
	return b.String()
}

// asciiPrefix is the length of the run of ASCII bytes s starts with.
func asciiPrefix(s string) int {
	i := 0
	for ; i+8 <= len(s); i += 8 {
		if le64(s[i:])&highBits != 0 {
			break
		}
	}
	for ; i < len(s) && s[i] < utf8.RuneSelf; i++ {
	}
	return i
}

func isUnicode9Inert(r rune) bool {
	lo, hi := 0, len(unicode9Inert)
	for lo < hi {
		m := (lo + hi) / 2
		switch {
		case r < unicode9Inert[m][0]:
			hi = m
		case r > unicode9Inert[m][1]:
			lo = m + 1
		default:
			return true
		}
	}
	return false
}

// unicode9Inert lists, as inclusive ranges, the code points whose
// normalization properties (combining class, decomposition, composition
// boundaries, for NFC/NFD/NFKC/NFKD) differ between golang.org/x/text's
// Unicode 9.0.0 tables (x/text v0.15.0, tables9.0.0.go) and its current
// Unicode 17.0.0 tables (x/text v0.44.0). All were unassigned in 9.0.
// Derived by comparing norm.Form.Properties for every code point.
var unicode9Inert = [...][2]rune{
	{0x07FD, 0x07FD},
	{0x0897, 0x089F},
	{0x08CA, 0x08D3},
	{0x09FE, 0x09FE},
	{0x0C3C, 0x0C3C},
	{0x0D3B, 0x0D3C},
	{0x0EBA, 0x0EBA},
	{0x1715, 0x1715},
	{0x1ABF, 0x1ADD},
	{0x1AE0, 0x1AEB},
	{0x1DF6, 0x1DFA},
	{0x32FF, 0x32FF},
	{0xA7F1, 0xA7F4},
	{0xA82C, 0xA82C},
	{0xAB69, 0xAB69},
	{0x105C9, 0x105C9},
	{0x105D2, 0x105D2},
	{0x105DA, 0x105DA},
	{0x105E4, 0x105E4},
	{0x10781, 0x10785},
	{0x10787, 0x107B0},
	{0x107B2, 0x107BA},
	{0x10D24, 0x10D27},
	{0x10D69, 0x10D6D},
	{0x10EAB, 0x10EAC},
	{0x10EFA, 0x10EFB},
	{0x10EFD, 0x10EFF},
	{0x10F46, 0x10F50},
	{0x10F82, 0x10F85},
	{0x11070, 0x11070},
	{0x1133B, 0x1133B},
	{0x11382, 0x11385},
	{0x1138B, 0x1138B},
	{0x1138E, 0x1138E},
	{0x11390, 0x11391},
	{0x113B8, 0x113B8},
	{0x113BB, 0x113BB},
	{0x113C2, 0x113C2},
	{0x113C5, 0x113C5},
	{0x113C7, 0x113C9},
	{0x113CE, 0x113D0},
	{0x1145E, 0x1145E},
	{0x11839, 0x1183A},
	{0x11930, 0x11930},
	{0x11935, 0x11935},
	{0x11938, 0x11938},
	{0x1193D, 0x1193E},
	{0x11943, 0x11943},
	{0x119E0, 0x119E0},
	{0x11A34, 0x11A34},
	{0x11A47, 0x11A47},
	{0x11A99, 0x11A99},
	{0x11D42, 0x11D42},
	{0x11D44, 0x11D45},
	{0x11D97, 0x11D97},
	{0x11F41, 0x11F42},
	{0x1611E, 0x16129},
	{0x1612F, 0x1612F},
	{0x16D63, 0x16D63},
	{0x16D67, 0x16D6A},
	{0x16FF0, 0x16FF1},
	{0x1CCD6, 0x1CCF9},
	{0x1E030, 0x1E06D},
	{0x1E08F, 0x1E08F},
	{0x1E130, 0x1E136},
	{0x1E2AE, 0x1E2AE},
	{0x1E2EC, 0x1E2EF},
	{0x1E4EC, 0x1E4EF},
	{0x1E5EE, 0x1E5EF},
	{0x1E6E3, 0x1E6E3},
	{0x1E6E6, 0x1E6E6},
	{0x1E6EE, 0x1E6EF},
	{0x1E6F5, 0x1E6F5},
	{0x1F16C, 0x1F16C},
	{0x1FBF0, 0x1FBF9},
}
