package tokenizer

import (
	"fmt"
	"hash/maphash"
	"runtime"
	"testing"
)

// TestVocabIndexExact: every entry is found with its id, strings that are
// not entries (prefixes, extensions, one byte changed) miss, and an entry
// kept in clash (its hash taken by an earlier entry) is found there while
// the entry holding the hash slot still answers for itself.
func TestVocabIndexExact(t *testing.T) {
	var keys []string
	var ids []uint32
	for i := range 5000 {
		keys = append(keys, fmt.Sprintf("tok%d\x00\xff", i))
		ids = append(ids, uint32(3*i+1))
	}
	v := newVocabIndex(keys, ids)
	for i, k := range keys {
		if id, ok := v.get(k); !ok || id != ids[i] {
			t.Fatalf("get(%q) = %d, %v; want %d", k, id, ok, ids[i])
		}
		for _, miss := range []string{k[:len(k)-1], k + "x", "x" + k[1:]} {
			if id, ok := v.get(miss); ok {
				t.Fatalf("get(%q) = %d, want a miss", miss, id)
			}
		}
	}
	// keys[1] as if its hash were keys[0]'s: moved to clash.
	delete(v.byHash, maphash.String(v.seed, keys[1]))
	v.clash = map[string]uint32{keys[1]: ids[1]}
	for i := range 2 {
		if id, ok := v.get(keys[i]); !ok || id != ids[i] {
			t.Errorf("with a clash, get(%q) = %d, %v; want %d", keys[i], id, ok, ids[i])
		}
	}
	if id, ok := v.get("absent"); ok {
		t.Errorf("with a clash, get(absent) = %d, want a miss", id)
	}
}

// TestTokenizerHeapObjects: a loaded tokenizer's tables are a few heap
// objects, not one or more per vocabulary entry (Qwen3 has 151,643), so
// the garbage collector's every cycle does not mark them one by one.
func TestTokenizerHeapObjects(t *testing.T) {
	objects := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapObjects
	}
	before := objects()
	tok, err := Load(qwenDir)
	if err != nil {
		t.Fatal(err)
	}
	tok.Encode("warm the word cache: "+fmt.Sprint(make([]int, 500)), false)
	after := objects()
	runtime.KeepAlive(tok)
	if n := int64(after) - int64(before); n > 20000 {
		t.Errorf("a loaded Qwen3 tokenizer holds %d heap objects, want at most 20,000", n)
	} else {
		t.Logf("a loaded Qwen3 tokenizer holds %d heap objects", n)
	}
}
