package enginesim

import (
	"encoding/binary"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/zeebo/xxh3"
)

// refFastHash is FastHasher's digest as documented (XXH3-64 over the parent
// digest or NONE_HASH, tokens little-endian, 0xff-separated extra keys),
// written independently of HashBlock: the two must agree, so a change to
// HashBlock cannot silently change the fast algorithm's digests.
func refFastHash(seed string, parent []byte, tokens []uint32, extra []any) []byte {
	var none [8]byte
	binary.BigEndian.PutUint64(none[:], xxh3.HashString(seed))
	if parent == nil {
		parent = none[:]
	}
	b := append([]byte(nil), parent...)
	for _, t := range tokens {
		b = binary.LittleEndian.AppendUint32(b, t)
	}
	for _, k := range extra {
		b = append(b, 0xff)
		switch v := k.(type) {
		case string:
			b = append(b, v...)
		case int:
			b = binary.LittleEndian.AppendUint64(b, uint64(v))
		}
	}
	return binary.BigEndian.AppendUint64(nil, xxh3.Hash(b))
}

func TestFastHasherMatchesDefinition(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	h := NewFastHasher("42")
	var parent []byte
	for i := range 200 {
		toks := make([]uint32, rng.IntN(40))
		for j := range toks {
			toks[j] = rng.Uint32()
		}
		var extra []any
		switch i % 4 {
		case 1:
			extra = []any{"lora-a"}
		case 2:
			extra = []any{"lora-a", "salt"}
		case 3:
			extra = []any{i}
		}
		want := refFastHash("42", parent, toks, extra)
		got := h.HashBlock(parent, toks, extra)
		if !slices.Equal(got, want) {
			t.Fatalf("block %d: digest %x, want %x", i, got, want)
		}
		parent = append(parent[:0], got...)
		if i%10 == 0 {
			parent = nil
		}
	}
}
