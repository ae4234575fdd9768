package tokenizer

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"

	"github.com/ardanlabs/jinja"
)

// Integers beyond int64. Python's json.loads (vLLM parsing tool-call
// arguments) and the request parser give exact Python ints of any size, and
// transformers' tojson (json.dumps) and {{ }} (str) print all their digits.
// The template engine's integers are int64, so an integer beyond that range
// is decoded as a placeholder: an int64 of the same sign, beyond every
// other integer of the request in magnitude and in the same order as the
// true values (so comparisons with the request's numbers come out as in
// Python), whose 19 digits occur nowhere in the request or the template.
// After rendering, each placeholder's digits are replaced by the true
// digits. The chat is rendered twice with two different placeholder sets;
// a template that computes with such an integer (n + 1, n | float) prints
// something other than the placeholder's digits, so the two renderings
// differ and Render returns ErrUnsupported rather than a wrong prompt.
// Not detected: a template that compares such an integer with a float or
// literal beyond 1e18, or measures or slices its text (n | string | length).

// pythonMaxIntDigits is CPython's default limit on int<->str conversion
// (sys.int_info.default_max_str_digits, Python >= 3.11): json.loads and
// json.dumps of a longer integer raise ValueError.
const pythonMaxIntDigits = 4300

// minPlaceholder is the smallest placeholder magnitude: 19 digits, above
// any integer a template plausibly writes itself.
const minPlaceholder = 1_000_000_000_000_000_000

// bigInts carries the integers beyond int64 through decoding: while
// collecting (subst nil) it records them and the largest magnitude of the
// other integers; with subst it maps each one (its JSON text) to its
// placeholder.
type bigInts struct {
	seen   map[string]bool
	maxAbs uint64
	subst  map[string]int64
}

// value returns the template value of the JSON integer s, which does not
// fit in an int64.
func (b *bigInts) value(s string) (jinja.Value, error) {
	if b == nil {
		return jinja.Undefined(), fmt.Errorf("%w: integer %s beyond int64", ErrUnsupported, s)
	}
	if len(strings.TrimPrefix(s, "-")) > pythonMaxIntDigits {
		return jinja.Undefined(), fmt.Errorf("%w: integer of %d digits (Python refuses more than %d)",
			ErrUnsupported, len(strings.TrimPrefix(s, "-")), pythonMaxIntDigits)
	}
	if b.subst != nil {
		p, ok := b.subst[s]
		if !ok { // cannot happen: the same input decodes to the same integers
			return jinja.Undefined(), fmt.Errorf("%w: integer %s beyond int64", ErrUnsupported, s)
		}
		return jinja.NewInt(p), nil
	}
	if b.seen == nil {
		b.seen = map[string]bool{}
	}
	b.seen[s] = true
	return jinja.NewInt(0), nil
}

// small records an int64 of the request.
func (b *bigInts) small(n int64) {
	if b != nil {
		if a := absU64(n); a > b.maxAbs {
			b.maxAbs = a
		}
	}
}

func absU64(n int64) uint64 {
	if n < 0 {
		return uint64(-(n + 1)) + 1
	}
	return uint64(n)
}

// compareInts orders decimal integers (JSON's form: no leading zeros).
func compareInts(a, b string) int {
	na, nb := strings.HasPrefix(a, "-"), strings.HasPrefix(b, "-")
	if na != nb {
		if na {
			return -1
		}
		return 1
	}
	da, db := strings.TrimPrefix(a, "-"), strings.TrimPrefix(b, "-")
	c := cmp.Or(cmp.Compare(len(da), len(db)), strings.Compare(da, db))
	if na {
		return -c
	}
	return c
}

// placeholders assigns the integers collected in b placeholders whose
// digits occur in none of avoid nor in taken (another set's), drawing from
// rng. It fails when the request's own integers leave no room.
func placeholders(b *bigInts, avoid []string, taken map[int64]bool, rng *rand.Rand) (map[string]int64, error) {
	var pos, neg []string
	for s := range b.seen {
		if strings.HasPrefix(s, "-") {
			neg = append(neg, s)
		} else {
			pos = append(pos, s)
		}
	}
	lo := max(uint64(minPlaceholder), b.maxAbs+1)
	if lo > math.MaxInt64-1<<40 {
		return nil, fmt.Errorf("%w: integers beyond int64 beside int64s near its limit", ErrUnsupported)
	}
	span := uint64(math.MaxInt64) - lo + 1
	subst := make(map[string]int64, len(b.seen))
	for _, group := range [][]string{pos, neg} {
		// Ascending magnitudes: positives in value order, negatives in
		// reverse, so that the placeholders keep the values' order.
		slices.SortFunc(group, func(x, y string) int {
			return compareInts(strings.TrimPrefix(x, "-"), strings.TrimPrefix(y, "-"))
		})
		mags, err := drawMagnitudes(len(group), lo, span, avoid, taken, rng)
		if err != nil {
			return nil, err
		}
		for i, s := range group {
			p := int64(mags[i])
			if strings.HasPrefix(s, "-") {
				p = -p
			}
			subst[s] = p
		}
	}
	return subst, nil
}

// drawMagnitudes draws n distinct sorted magnitudes in [lo, lo+span) whose
// digits are in no string of avoid and which are not taken.
func drawMagnitudes(n int, lo, span uint64, avoid []string, taken map[int64]bool, rng *rand.Rand) ([]uint64, error) {
	mags := make([]uint64, 0, n)
	for tries := 0; len(mags) < n; tries++ {
		if tries == 64*n+64 {
			return nil, fmt.Errorf("%w: no placeholder for integers beyond int64", ErrUnsupported)
		}
		m := lo + rng.Uint64N(span)
		digits := strconv.FormatUint(m, 10)
		if slices.Contains(mags, m) || taken[int64(m)] || slices.ContainsFunc(avoid, func(s string) bool { return strings.Contains(s, digits) }) {
			continue
		}
		mags = append(mags, m)
	}
	slices.Sort(mags)
	return mags, nil
}

// restorer replaces each placeholder's digits with its integer's.
func restorer(subst map[string]int64) *strings.Replacer {
	pairs := make([]string, 0, 2*len(subst))
	for s, p := range subst {
		pairs = append(pairs, strconv.FormatUint(absU64(p), 10), strings.TrimPrefix(s, "-"))
	}
	return strings.NewReplacer(pairs...)
}
