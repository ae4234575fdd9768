package tokenizer

import (
	"encoding/json"
	"fmt"
	"hash/maphash"
	"slices"
	"strings"
	"testing"
)

// FuzzMergeLinearVsHeap checks that the two merge loops agree on any
// word: the scan used for short words and the heap used for long ones.
func FuzzMergeLinearVsHeap(f *testing.F) {
	for _, c := range readJSONL(f, qwenDir+"/encode.jsonl") {
		f.Add(c.Text)
	}
	f.Add(strings.Repeat(" ", 200))
	tok := loadQwen(f)
	f.Fuzz(func(t *testing.T, w string) {
		if w == "" || len(w) > 2048 {
			return
		}
		b := tok.model
		mk := func() []symbol {
			sym := make([]symbol, len(w))
			for i := range sym {
				sym[i] = symbol{id: b.byteID[w[i]], prev: int32(i - 1), next: int32(i + 1)}
			}
			sym[len(w)-1].next = -1
			return sym
		}
		ids := func(sym []symbol) []uint32 {
			var out []uint32
			for i := int32(0); i >= 0; i = sym[i].next {
				out = append(out, sym[i].id)
			}
			return out
		}
		lin, hp := mk(), mk()
		b.mergeLinear(lin)
		b.mergeHeap(hp, &scratch{})
		if got, want := ids(hp), ids(lin); !slices.Equal(got, want) {
			t.Fatalf("%q: heap %v, linear %v", w, got, want)
		}
	})
}

func TestMergeTable(t *testing.T) {
	m := newMergeTable(3)
	m.put(pairKey(0, 0), merge{rank: 1, id: 7})
	m.put(pairKey(1, 2), merge{rank: 2, id: 8})
	m.put(pairKey(1, 2), merge{rank: 5, id: 9}) // overwrite: last wins
	if got, ok := m.get(0, 0); !ok || got != (merge{1, 7}) {
		t.Errorf("get(0,0) = %v %v", got, ok)
	}
	if got, ok := m.get(1, 2); !ok || got != (merge{5, 9}) {
		t.Errorf("get(1,2) = %v %v", got, ok)
	}
	if _, ok := m.get(2, 1); ok {
		t.Error("get(2,1) found")
	}
}

func TestParseMergesForms(t *testing.T) {
	for _, c := range []struct {
		name, json string
		want       [][2]string
		err        bool
	}{
		{"strings", `["a b", "Ġ t"]`, [][2]string{{"a", "b"}, {"Ġ", "t"}}, false},
		{"pairs", `[["a", "b"], ["Ġ", "t"]]`, [][2]string{{"a", "b"}, {"Ġ", "t"}}, false},
		{"null", `null`, nil, false},
		{"no space", `["ab"]`, nil, true},
		{"two spaces", `["a b c"]`, nil, true},
		{"number", `[1]`, nil, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := parseMerges(json.RawMessage(c.json))
			if (err != nil) != c.err {
				t.Fatalf("err = %v, want error %v", err, c.err)
			}
			if !c.err && !slices.Equal(got, c.want) {
				t.Errorf("got %q, want %q", got, c.want)
			}
		})
	}
}

func TestWordCacheBounded(t *testing.T) {
	c := newWordCache()
	for i := range cacheShards * cacheEntriesPerShd * 2 {
		c.put(strings.Repeat("x", i%50)+string(rune('a'+i%26))+strings.Repeat("y", i/1300), []uint32{uint32(i)})
	}
	total := 0
	for i := range c.shards {
		if n := len(c.shards[i].at); n > cacheEntriesPerShd {
			t.Errorf("shard %d holds %d > %d", i, n, cacheEntriesPerShd)
		}
		total += len(c.shards[i].at)
	}
	if total == 0 {
		t.Error("cache empty")
	}
}

// TestWordCacheExact: get finds each word put with its own ids, never a
// word of the same hash, and ids it returned earlier stay intact while
// later puts fill, clear and refill their shard (and while callers append
// to them).
func TestWordCacheExact(t *testing.T) {
	c := newWordCache()
	const n = cacheShards * cacheEntriesPerShd * 3
	word := func(i int) string { return fmt.Sprintf("w%d", i) }
	idsOf := func(i int) []uint32 { return []uint32{uint32(i), uint32(i * 7), uint32(len(word(i)))}[:1+i%3] }
	kept := map[int][]uint32{}
	for i := range n {
		got := c.put(word(i), idsOf(i))
		if i%997 == 0 {
			kept[i] = got
			_ = append(got, 0xdead) // a caller's append must not reach the cache
		}
		if g, ok := c.get(word(i)); !ok || !slices.Equal(g, idsOf(i)) {
			t.Fatalf("get(%q) right after put = %v, %v; want %v", word(i), g, ok, idsOf(i))
		}
	}
	for i, ids := range kept {
		if !slices.Equal(ids, idsOf(i)) {
			t.Errorf("ids returned for %q became %v, want %v", word(i), ids, idsOf(i))
		}
	}
	found := 0
	for i := range n {
		if g, ok := c.get(word(i)); ok {
			found++
			if !slices.Equal(g, idsOf(i)) {
				t.Fatalf("get(%q) = %v, want %v", word(i), g, idsOf(i))
			}
		}
	}
	if found == 0 || found > cacheShards*cacheEntriesPerShd {
		t.Errorf("%d words found, want 1..%d", found, cacheShards*cacheEntriesPerShd)
	}
	// A hash slot naming another word's entry (two words of one hash):
	// get compares the bytes and misses.
	c = newWordCache()
	c.put("alpha", []uint32{1})
	h := maphash.String(c.seed, "alpha")
	sh := &c.shards[h%cacheShards]
	own := sh.at[h]
	sh.at[h] = uint32(len(sh.data))
	sh.data = append(sh.data, uint32(len(sh.words)), 5, 1, 2)
	sh.words = append(sh.words, "alphb"...)
	if g, ok := c.get("alpha"); ok {
		t.Errorf("get(alpha) through alphb's entry = %v, want a miss", g)
	}
	sh.at[h] = own
	if g, ok := c.get("alpha"); !ok || !slices.Equal(g, []uint32{1}) {
		t.Errorf("get(alpha) = %v, %v; want [1]", g, ok)
	}
}

// TestWordKeyIdentifiesShortWords: the front cache compares keys, not
// bytes, for words of up to 16 bytes, so a change of any one byte must
// change the key.
func TestWordKeyIdentifiesShortWords(t *testing.T) {
	base := []byte("abcdefghijklmnopq")
	for n := 1; n <= 16; n++ {
		w := string(base[:n])
		for p := range n {
			for _, c := range []byte{0, 'A', 0x80, 0xff} {
				v := []byte(w)
				v[p] = c
				if string(v) != w && keyOf(string(v)) == keyOf(w) {
					t.Errorf("keyOf(%q) == keyOf(%q)", v, w)
				}
			}
		}
	}
}

// TestFrontCacheWays checks the two ways of a set: a second word in a set
// keeps the first, a third evicts the oldest, and reset empties both.
func TestFrontCacheWays(t *testing.T) {
	var f frontCache
	words := []string{"alpha", "beta", "gamma"}
	k := make([]wordKey, len(words))
	for i, w := range words {
		k[i] = keyOf(w)
	}
	const set = 42 // any even index; the words need not hash there
	f.set(set, k[0], words[0], []uint32{1})
	f.set(set, k[1], words[1], []uint32{2})
	for i, w := range words[:2] {
		if ids, ok := f.get(set, k[i], w); !ok || ids[0] != uint32(i+1) {
			t.Fatalf("after two words, get(%q) = %v, %v", w, ids, ok)
		}
	}
	f.set(set, k[2], words[2], []uint32{3})
	if _, ok := f.get(set, k[0], words[0]); ok {
		t.Error("the oldest word survived a third word in its set")
	}
	if ids, ok := f.get(set, k[2], words[2]); !ok || ids[0] != 3 {
		t.Errorf("get(%q) = %v, %v after setting it", words[2], ids, ok)
	}
	// Same length and key, bytes differing where the key does not look
	// (words over 16 bytes): compared as strings.
	for _, pair := range [][2]string{{"01234567-x-abcdefgh", "01234567-y-abcdefgh"},
		{"0123456789abcdef-x-0123456789abcdef", "0123456789abcdef-y-0123456789abcdef"}} {
		if keyOf(pair[0]) != keyOf(pair[1]) {
			t.Fatalf("%q and %q: want equal keys for this check", pair[0], pair[1])
		}
		f.set(set, keyOf(pair[0]), pair[0], []uint32{4})
		if _, ok := f.get(set, keyOf(pair[1]), pair[1]); ok {
			t.Errorf("get(%q) found %q's entry", pair[1], pair[0])
		}
	}
	f.reset()
	for i, w := range words {
		if _, ok := f.get(set, k[i], w); ok {
			t.Errorf("get(%q) found an entry after reset", w)
		}
	}
}
