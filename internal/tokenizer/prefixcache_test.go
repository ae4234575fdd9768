package tokenizer

import (
	"encoding/json"
	"fmt"
	"slices"
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
				if got, want := tok.encodeCached(text, cache), tok.Encode(text, false); !slices.Equal(got, want) {
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
			if got, want := tok.encodeCached(s, cache), tok.Encode(s, false); !slices.Equal(got, want) {
				t.Fatalf("%q: cached %v, full %v", s, got, want)
			}
		}
	})
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
				if got, want := tok.encodeCached(text, cache), tok.Encode(text, false); !slices.Equal(got, want) {
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
}
