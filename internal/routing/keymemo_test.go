package routing

import (
	"slices"
	"testing"

	"kvrouter/internal/kvindex"
)

// fakeMemo is a KeyMemo over one prompt: kept are the keys a previous
// prompt left (under keptTag), stored the blocks of this prompt's prefix
// it takes keys of.
type fakeMemo struct {
	keptTag uint64
	kept    []uint64
	stored  int // blocks
	setTag  uint64
	set     []uint64
}

func (m *fakeMemo) Keys(tag uint64) []uint64 {
	if tag != m.keptTag {
		return nil
	}
	return m.kept
}

func (m *fakeMemo) Want(tag uint64, blockSize int) int {
	if m.set != nil && m.setTag == tag {
		return 0
	}
	return m.stored
}

func (m *fakeMemo) SetKeys(tag uint64, keys []uint64) { m.setTag, m.set = tag, keys }

func asUint64(keys []kvindex.Key) []uint64 {
	out := make([]uint64, len(keys))
	for i, k := range keys {
		out[i] = uint64(k)
	}
	return out
}

// TestPromptKeysMemo: keys continued from kept keys equal kvindex.Keys of
// the whole prompt, with and without LoRA and cache_salt; the memo is
// offered the prompt's keys; kept keys of another tag, or longer than the
// prompt, are not used; multimodal prompts hash everything.
func TestPromptKeysMemo(t *testing.T) {
	const bs = 4
	toks := make([]uint32, 103)
	for i := range toks {
		toks[i] = uint32(i*7 + 1)
	}
	for _, ex := range []kvindex.Extras{
		{Root: 11},
		{Root: 11, LoRA: "sql"},
		{Root: 11, CacheSalt: "s"},
		{Root: 12, LoRA: "sql", CacheSalt: "s"},
	} {
		want := kvindex.Keys(nil, toks, bs, ex)
		tag := memoTag(ex, bs)
		prev := kvindex.Keys(nil, toks[:60], bs, ex) // the previous turn's prompt
		for _, tc := range []struct {
			name string
			memo *fakeMemo
		}{
			{"kept", &fakeMemo{keptTag: tag, kept: asUint64(prev[:12]), stored: 20}},
			{"none kept", &fakeMemo{keptTag: tag, stored: 20}},
			{"other tag", &fakeMemo{keptTag: tag + 1, kept: []uint64{1, 2, 3}, stored: 20}},
			{"longer than the prompt", &fakeMemo{keptTag: tag, kept: make([]uint64, 26), stored: 20}},
		} {
			req := &Request{Tokens: toks, Extras: ex, KeyMemo: tc.memo}
			for _, dst := range [][]kvindex.Key{nil, make([]kvindex.Key, 0, 12), make([]kvindex.Key, 3, 64)} {
				tc.memo.set = nil
				if got := promptKeys(dst, req, bs); !slices.Equal(got, want) {
					t.Fatalf("%+v, %s, dst cap %d: keys differ from kvindex.Keys", ex, tc.name, cap(dst))
				}
				if tc.memo.setTag != tag || !slices.Equal(tc.memo.set, asUint64(want[:20])) {
					t.Fatalf("%+v, %s: memo offered %d keys under %d, want the first 20 under %d", ex, tc.name, len(tc.memo.set), tc.memo.setTag, tag)
				}
			}
		}
		if memoTag(ex, bs+1) == tag || memoTag(kvindex.Extras{Root: ex.Root + 1, LoRA: ex.LoRA, CacheSalt: ex.CacheSalt}, bs) == tag {
			t.Fatalf("%+v: the tag ignores the block size or the root", ex)
		}
	}
	if memoTag(kvindex.Extras{LoRA: "ab"}, bs) == memoTag(kvindex.Extras{LoRA: "a", CacheSalt: "b"}, bs) {
		t.Fatal("the tag confuses LoRA and cache_salt")
	}
	mm := kvindex.Extras{Root: 11, MM: []kvindex.MMItem{{Identifier: "img", Offset: 5, Length: 8}}}
	memo := &fakeMemo{keptTag: memoTag(mm, bs), kept: []uint64{1, 2, 3}, stored: 20}
	if got := promptKeys(nil, &Request{Tokens: toks, Extras: mm, KeyMemo: memo}, bs); !slices.Equal(got, kvindex.Keys(nil, toks, bs, mm)) || memo.set != nil {
		t.Fatal("a multimodal prompt used or fed the memo")
	}
}
