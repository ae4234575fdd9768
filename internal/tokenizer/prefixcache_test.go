package tokenizer

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestPrefixCacheGoldenTurns replays every golden chat (Qwen3,
// testdata/tokenizer/qwen3/chat.jsonl) turn by turn through one cached
// Local, as a conversation arrives: the first k messages with the
// generation prompt, for each k. Every encode equals the full encode, the
// last one the golden ids, and continuations hit the cache.
func TestPrefixCacheGoldenTurns(t *testing.T) {
	plain := sharedQwen3(t)
	reg := prometheus.NewRegistry()
	cache, err := NewPrefixCache(PrefixCacheConfig{Model: "qwen3"}, reg)
	if err != nil {
		t.Fatal(err)
	}
	cached := plain.WithPrefixCache(cache)
	for n, c := range loadChatCases(t) {
		var msgs []json.RawMessage
		if err := json.Unmarshal(c.Messages, &msgs); err != nil {
			t.Fatal(err)
		}
		for k := 1; k <= len(msgs); k++ {
			req := c.request()
			req.Messages, _ = json.Marshal(msgs[:k])
			if k < len(msgs) {
				req.AddGenerationPrompt = true
			}
			text, got, err := cached.EncodeChat(req)
			if err != nil {
				continue // e.g. a template that refuses a partial conversation
			}
			if want := plain.tok.Encode(text, false); !slices.Equal(got, want) {
				t.Fatalf("case %d, %d messages: cached ids differ from the full encode at %d", n, k, firstDiffIDs(got, want))
			}
			if k == len(msgs) && !slices.Equal(got, c.IDs) {
				t.Fatalf("case %d: cached ids differ from the golden ids at %d", n, firstDiffIDs(got, c.IDs))
			}
		}
	}
	if hits := testutil.ToFloat64(cache.m.hits); hits < 20 {
		t.Errorf("%v prefix cache hits over the golden conversations, want >= 20", hits)
	}
	if b := testutil.ToFloat64(cache.m.bytes); b <= 0 || int64(b) != cache.bytes {
		t.Errorf("bytes gauge %v, cache holds %d", b, cache.bytes)
	}
}

// TestPrefixCacheCuts covers the texts where a cut could go wrong: an
// added token written inside content, a partial token before a cut, text
// that merges across where another prompt has a token, and eviction.
func TestPrefixCacheCuts(t *testing.T) {
	tok := loadQwen(t)
	cache, err := NewPrefixCache(PrefixCacheConfig{MaxBytes: 4 << 10}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, conv := range [][]string{
		{"<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyes<|im_end|>\n<|im_start|>assistant\n"},
		{"a<|im_start|>", "a<|im_start|>b<|im_end|>", "a<|im_st", "a<|im_start|><|im_start|>"},
		{"<think>x</think><|im_end|>", "<think>x</think>y<|im_end|>", "<think>x</think><|im_end|>z"},
		{"hello world<|im_end|>", "hello world<|im_end|>!", "hello world <|im_end|>", "hello worl<|im_end|>d"},
		{"  <|im_start|>  ", "  <|im_start|>  <|im_end|>", " <|im_start|>"},
		{"<|im_start|>", "<|im_start|><|im_end|>", "<|im_start|>x"},
	} {
		for _, text := range conv {
			for range 2 {
				if got, want := cachedIDs(tok, text, cache), tok.Encode(text, false); !slices.Equal(got, want) {
					t.Fatalf("%q: cached %v, full %v", text, got, want)
				}
			}
		}
	}
	if cache.bytes > cache.max {
		t.Fatalf("cache holds %d bytes, bound %d", cache.bytes, cache.max)
	}
	long := make([]byte, 0, 8<<10)
	for len(long) < 6<<10 {
		long = append(long, "one more sentence of the history. "...)
	}
	text := string(long) + "<|im_end|>"
	tok.encodeCached(text, cache) // its prefix needs more than the bound
	if cache.bytes > cache.max {
		t.Fatalf("cache holds %d bytes after an oversized prefix, bound %d", cache.bytes, cache.max)
	}
	checkLens(t, cache)
}

// checkLens checks the cache's count of entries by prefix length against
// its entries.
func checkLens(t *testing.T, c *PrefixCache) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	want := map[int]int{}
	for k := range c.entries {
		want[k.n]++
	}
	if !maps.Equal(c.lens, want) {
		t.Fatalf("entries by length %v, counted %v", want, c.lens)
	}
}

// FuzzPrefixCache: encodes through a shared, small cache equal the full
// encode, whatever was cached before (a, then a+b, then b, then b+a).
func FuzzPrefixCache(f *testing.F) {
	for _, c := range readJSONL(f, qwenDir+"/encode.jsonl") {
		f.Add(c.Text, "<|im_end|>\n<|im_start|>user\n"+c.Text)
	}
	f.Add("<|im_start|>user\nhi", "<|im_end|>\n<|im_start|>assistant\n")
	f.Add("x<|im_st", "art|>y")
	f.Add("\xff<|im_start|>", "\xfe<|im_end|>")
	tok := loadQwen(f)
	cache, err := NewPrefixCache(PrefixCacheConfig{MaxBytes: 64 << 10}, nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		for _, s := range []string{a, a + b, b, b + a, a + b} {
			if got, want := cachedIDs(tok, s, cache), tok.Encode(s, false); !slices.Equal(got, want) {
				t.Fatalf("%q: cached %v, full %v", s, got, want)
			}
		}
	})
}

// cachedIDs is tok.encodeCached's ids.
func cachedIDs(tok *Tokenizer, text string, cache *PrefixCache) []uint32 {
	ids, _ := tok.encodeCached(text, cache)
	return ids
}

// TestPrefixMemoKeys keeps keys on a prompt's memo and finds them from
// the next turn's: only under the same tag, only for the blocks of the
// stored prefix, counted in the bytes and the bound, and gone with their
// entry.
func TestPrefixMemoKeys(t *testing.T) {
	tok := loadQwen(t)
	cache, err := NewPrefixCache(PrefixCacheConfig{Model: "m"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	const bs, tag = 4, 77
	turn1 := "<|im_start|>user\nhow far is the moon from the earth, roughly, in kilometres?<|im_end|>\n<|im_start|>assistant\n"
	turn2 := turn1 + "About 384,400 km on average.<|im_end|>\n<|im_start|>user\nand the sun?<|im_end|>\n<|im_start|>assistant\n"
	ids1, m1 := tok.encodeCached(turn1, cache)
	if m1.Keys(tag) != nil {
		t.Fatal("a first turn has kept keys")
	}
	stored := len(tok.Encode(turn1[:strings.LastIndex(turn1, "<|im_start|>")], false))
	if n := m1.Want(tag, bs); n != stored/bs || n == 0 {
		t.Fatalf("first turn wants %d keys, want %d (stored prefix of %d of %d ids)", n, stored/bs, stored, len(ids1))
	}
	keys := make([]uint64, stored/bs)
	for i := range keys {
		keys[i] = uint64(1000 + i)
	}
	before := cache.bytes
	m1.SetKeys(tag, keys)
	if got := cache.bytes - before; got != int64(8*len(keys)) {
		t.Fatalf("keeping %d keys added %d bytes, want %d", len(keys), got, 8*len(keys))
	}
	if n := m1.Want(tag, bs); n != 0 {
		t.Fatalf("after SetKeys the memo still wants %d keys", n)
	}
	if n := m1.Want(tag+1, bs); n == 0 {
		t.Fatal("another tag's keys are not wanted")
	}
	_, m2 := tok.encodeCached(turn2, cache)
	if got := m2.Keys(tag); !slices.Equal(got, keys) {
		t.Fatalf("next turn finds keys %v, want %v", got, keys)
	}
	if got := m2.Keys(tag + 1); got != nil {
		t.Fatalf("next turn finds keys %v under another tag", got)
	}
	if got := testutil.ToFloat64(cache.m.hitKeys); got != float64(len(keys)) {
		t.Fatalf("hit keys counter %v, want %d", got, len(keys))
	}
	var none *PrefixMemo
	if none.Keys(tag) != nil || none.Want(tag, bs) != 0 {
		t.Fatal("a nil memo holds something")
	}
	none.SetKeys(tag, keys) // no panic

	// Keys count in the bound: an entry whose keys overflow it goes.
	small, err := NewPrefixCache(PrefixCacheConfig{MaxBytes: int64(4*stored + prefixEntryOverhead + 8)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, m := tok.encodeCached(turn1, small)
	if m.Want(tag, bs) == 0 {
		t.Fatal("small cache: nothing stored")
	}
	m.SetKeys(tag, keys)
	if small.bytes > small.max || len(small.entries) != 0 {
		t.Fatalf("small cache holds %d bytes in %d entries, bound %d", small.bytes, len(small.entries), small.max)
	}
	if _, m := tok.encodeCached(turn2, small); m.Keys(tag) != nil {
		t.Fatal("keys found after their entry was evicted")
	}
}

func firstDiffIDs(a, b []uint32) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// TestPrefixCacheConcurrent encodes conversations that share their start
// from several goroutines through one small cache (run with -race).
func TestPrefixCacheConcurrent(t *testing.T) {
	tok := loadQwen(t)
	cache, err := NewPrefixCache(PrefixCacheConfig{MaxBytes: 16 << 10}, nil)
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 4)
	for g := range 4 {
		go func() {
			text := "<|im_start|>system\nshared start<|im_end|>\n"
			for turn := range 30 {
				text += fmt.Sprintf("<|im_start|>user\nquestion %d of %d<|im_end|>\n<|im_start|>assistant\n", turn, g)
				if got, want := cachedIDs(tok, text, cache), tok.Encode(text, false); !slices.Equal(got, want) {
					errs <- fmt.Errorf("goroutine %d turn %d: cached ids differ at %d", g, turn, firstDiffIDs(got, want))
					return
				}
				text += "answer<|im_end|>\n"
			}
			errs <- nil
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	checkLens(t, cache)
}
