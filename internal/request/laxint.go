package request

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"strconv"
	"strings"
	"unicode"
)

// tokenCeiling bounds the token counts LaxInt returns: a larger count
// (vLLM accepts any size, then refuses it as longer than the context)
// reads as tokenCeiling, so that sums of a prompt length and an output
// budget cannot overflow.
const tokenCeiling = min(1<<53, math.MaxInt)

// LaxInt reads raw, a JSON value other than null, as vLLM reads a field
// typed `int | None` (max_tokens, max_completion_tokens,
// max_output_tokens): Python's json.loads, then pydantic 2's lax int
// (vLLM's OpenAIBaseModel sets no strict mode). Accepted, with the integer
// they make (testdata/pydantic_int.jsonl holds pydantic's own answers):
//   - a JSON integer of any size;
//   - a JSON number with a fraction or exponent whose float64 value is a
//     whole number in (-2^63, 2^63): 2.0, 1e3, 1e-400 (0);
//   - true (1) and false (0);
//   - a string that, with Unicode white space trimmed from both ends, is
//     an optional sign, decimal digits with single underscores between
//     digits, and optionally "." and one or more zeros: "2", " +1_000 ",
//     "2.00".
//
// Everything else (2.5, 1e20, "1e3", "0x10", arrays, objects) is refused:
// ok false. A value beyond ±tokenCeiling reads as ±tokenCeiling.
func LaxInt(raw []byte) (n int, ok bool) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return 0, false
	}
	switch c := raw[0]; {
	case c == 't' && string(raw) == "true":
		return 1, true
	case c == 'f' && string(raw) == "false":
		return 0, true
	case c == '"':
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return 0, false
		}
		return laxIntString(s)
	case c == '-' || c >= '0' && c <= '9':
		if bytes.ContainsAny(raw, ".eE") {
			return laxIntFloat(string(raw))
		}
		return clampDecimal(string(raw))
	}
	return 0, false
}

// laxIntFloat is laxInt for a JSON number with a fraction or exponent,
// which json.loads reads as a float.
func laxIntFloat(s string) (int, bool) {
	f, err := strconv.ParseFloat(s, 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) || math.IsInf(f, 0) {
		return 0, false // pydantic: finite_number
	}
	if f != math.Trunc(f) {
		return 0, false // int_from_float
	}
	if f <= -(1<<63) || f >= 1<<63 {
		return 0, false // int_parsing_size: pydantic takes floats in (-2^63, 2^63) only
	}
	return int(max(-tokenCeiling, min(tokenCeiling, f))), true
}

// laxIntString is laxInt for a string's contents.
func laxIntString(s string) (int, bool) {
	s = strings.TrimFunc(s, unicode.IsSpace)
	if whole, frac, found := strings.Cut(s, "."); found {
		if frac == "" || strings.Trim(frac, "0") != "" {
			return 0, false
		}
		s = whole
	}
	digits := s
	if digits != "" && (digits[0] == '+' || digits[0] == '-') {
		digits = digits[1:]
	}
	if digits == "" || digits[0] == '_' || digits[len(digits)-1] == '_' || strings.Contains(digits, "__") {
		return 0, false
	}
	for i := 0; i < len(digits); i++ {
		if c := digits[i]; c != '_' && (c < '0' || c > '9') {
			return 0, false
		}
	}
	return clampDecimal(strings.ReplaceAll(s, "_", ""))
}

// clampDecimal parses s, an optional sign and one or more decimal digits,
// clamped to ±tokenCeiling.
func clampDecimal(s string) (int, bool) {
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		return 0, false
	}
	return int(max(-tokenCeiling, min(tokenCeiling, v))), true
}
