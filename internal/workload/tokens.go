package workload

import "slices"

// Token ids produced by segment expansion lie in [TokenBase, TokenBase+TokenSpan):
// inside the regular vocabulary of the tokenizers kvrouter ships with (Qwen3
// has 151,643 regular tokens) and clear of the low ids some engines treat
// specially.
const (
	TokenBase = 1000
	TokenSpan = 1 << 16
)

// keyDigits is the number of leading tokens of a segment that spell its
// mixed key: 4 tokens of 16 bits each hold all 64 bits.
const keyDigits = 4

// Segment is a run of prompt tokens identified by Key. It expands to Len
// token ids:
//
//	m        = mix64(Key)                      (a bijection on uint64)
//	tok[i]   = TokenBase + (m >> (16*i)) & 0xffff        for i < 4
//	tok[i]   = TokenBase + mix64(m + i*φ) & 0xffff       for i >= 4
//
// where mix64 is SplitMix64's finaliser and φ = 0x9e3779b97f4a7c15. Because
// mix64 is a bijection, two segments of at least 4 tokens with different
// keys differ in their first four tokens; equal keys give equal tokens.
// Segments shorter than 4 tokens keep only a prefix of that guarantee.
type Segment struct {
	Key uint64
	Len int
}

// mix64 is the SplitMix64 output function (Steele, Lea, Flood 2014): a
// bijection on uint64 with good avalanche.
func mix64(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

const golden = 0x9e3779b97f4a7c15

// AppendTokens appends the segment's Len token ids to dst and returns it.
// It grows dst once and fills the new tokens in place; each token after the
// key digits costs one mix64 of a counter stepped by φ.
func (s Segment) AppendTokens(dst []uint32) []uint32 {
	if s.Len <= 0 {
		return dst
	}
	n := len(dst)
	dst = slices.Grow(dst, s.Len)[:n+s.Len]
	out := dst[n:]
	m := mix64(s.Key)
	for i := range min(len(out), keyDigits) {
		out[i] = TokenBase + uint32(m>>(16*i))&0xffff
	}
	if len(out) <= keyDigits {
		return dst
	}
	step := uint64(golden)
	z := m + keyDigits*step // m + i*φ for i = keyDigits, wrapping
	rest := out[keyDigits:]
	for i := range rest {
		rest[i] = TokenBase + uint32(mix64(z))&0xffff
		z += step
	}
	return dst
}

// key builds a segment key from a namespace (what kind of segment) and up to
// three indices. Distinct (ns, a, b, c) with ns < 32, a < 2^24, b < 2^20,
// c < 2^12 give distinct keys; generators stay inside those bounds (checked
// by their validate). Bits 61..63 are left for Repeat's copy index.
func key(ns, a, b, c uint64) uint64 {
	return ns<<56 | a<<32 | b<<12 | c
}

// Key namespaces (5 bits). Mooncake hash ids use nsMooncake with the id in
// the low 56 bits (the conversation trace's ids are below 2^18).
const (
	nsMooncake  = 0x01
	nsSystem    = 0x02
	nsQuestion  = 0x03
	nsUser      = 0x04
	nsAnswer    = 0x05
	nsUnique    = 0x06
	nsHot       = 0x07
	nsHotSuffix = 0x08
	nsBailian   = 0x09 // Qwen-Bailian hash ids, as nsMooncake
)

// copyShift places Repeat's copy index (0..7) in a key's top three bits.
const copyShift = 61

// maxCopies is the number of copies Repeat can keep apart.
const maxCopies = 8
