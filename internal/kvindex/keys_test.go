package kvindex

import (
	"encoding/json"
	"os"
	"testing"

	"kvrouter/internal/vllm"
)

func TestKeysChainAndFullBlocks(t *testing.T) {
	a := Keys(nil, seq(0, 10), 4, Extras{})
	if len(a) != 2 {
		t.Fatalf("10 tokens / 4 = %d keys, want 2 (partial block has no key)", len(a))
	}
	b := Keys(nil, seq(0, 8), 4, Extras{})
	if a[0] != b[0] || a[1] != b[1] {
		t.Fatal("same leading tokens must give same keys")
	}
	// A block is identified with everything before it: same block 1
	// tokens after a different block 0 give a different key.
	c := Keys(nil, append(seq(100, 4), seq(4, 4)...), 4, Extras{})
	if c[1] == a[1] {
		t.Fatal("block key must depend on its prefix")
	}
	if d := Keys(nil, seq(0, 8), 4, Extras{Root: Root("other", "")}); d[0] == a[0] {
		t.Fatal("different key spaces must not share keys")
	}
	if Root("m", "prefill") == Root("m", "decode") || Root("a", "b") == Root("ab", "") {
		t.Fatal("roots must separate model and pool")
	}
	salted := Keys(nil, seq(0, 8), 4, Extras{CacheSalt: "s"})
	if salted[0] == a[0] || salted[1] == a[1] {
		t.Fatal("cache_salt on block 0 must change every key after it")
	}
	lora := Keys(nil, seq(0, 8), 4, Extras{LoRA: "l"})
	if lora[0] == a[0] {
		t.Fatal("LoRA name must change keys")
	}
	if got := Keys(make([]Key, 0, 8), seq(0, 3), 4, Extras{}); len(got) != 0 {
		t.Fatal("under one block: no keys")
	}
	if got := Keys(nil, seq(0, 8), 0, Extras{}); len(got) != 0 {
		t.Fatal("block size 0: no keys")
	}
}

func TestKeysNoAlloc(t *testing.T) {
	toks := seq(0, 4096)
	dst := make([]Key, 0, 256)
	ex := Extras{LoRA: "l", CacheSalt: "s", MM: []MMItem{{"img", 10, 40}}}
	if n := testing.AllocsPerRun(100, func() { dst = Keys(dst, toks, 16, ex) }); n != 0 {
		t.Fatalf("Keys allocated %v times with capacity", n)
	}
}

type goldenCase struct {
	Name      string   `json:"name"`
	BlockSize int      `json:"block_size"`
	Tokens    []uint32 `json:"tokens"`
	Request   struct {
		LoRA  *string `json:"lora_name"`
		Salt  *string `json:"cache_salt"`
		Feats []struct {
			ID     string `json:"identifier"`
			Offset int    `json:"offset"`
			Length int    `json:"length"`
		} `json:"mm_features"`
	} `json:"request"`
	ExtraKeys [][]any       `json:"extra_keys_per_block"`
	Values    []json.Number `json:"event_values"`
}

// TestKeysMatchEventExtraKeys proves that a request's Extras (LoRA name,
// cache_salt, multimodal features) hash like the extra_keys vLLM computes for
// the same request (golden vectors from vLLM's own code, testdata/vllm):
// a request's keys find the blocks an engine reported with those extra keys.
func TestKeysMatchEventExtraKeys(t *testing.T) {
	raw, err := os.ReadFile("../../testdata/vllm/blockhash.json")
	if err != nil {
		t.Fatal(err)
	}
	var cases []goldenCase
	dec := json.NewDecoder(bytesReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&cases); err != nil {
		t.Fatal(err)
	}
	withExtras := 0
	for _, gc := range cases {
		t.Run(gc.Name, func(t *testing.T) {
			n := len(gc.Tokens) / gc.BlockSize
			if n == 0 {
				return
			}
			c := newClock()
			x, err := NewExact(Config{Model: "m", BlockSize: gc.BlockSize, Now: c.Now}, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			ev := vllm.Event{Type: vllm.BlockStored, TokenIDs: gc.Tokens[:n*gc.BlockSize], BlockSize: gc.BlockSize,
				LoRAName: gc.Request.LoRA, ExtraKeys: jsonTuples(gc.ExtraKeys)}
			for i, v := range gc.Values {
				u, err := parseU64(v)
				if err != nil {
					t.Fatal(err)
				}
				_ = i
				ev.BlockHashes = append(ev.BlockHashes, vllm.BlockHash(u))
			}
			x.Apply("e", &vllm.Batch{Events: []vllm.Event{ev}})
			ex := Extras{}
			if gc.Request.LoRA != nil {
				ex.LoRA = *gc.Request.LoRA
			}
			if gc.Request.Salt != nil {
				ex.CacheSalt = *gc.Request.Salt
			}
			for _, f := range gc.Request.Feats {
				ex.MM = append(ex.MM, MMItem{f.ID, f.Offset, f.Length})
			}
			if ex.LoRA != "" || ex.CacheSalt != "" || len(ex.MM) > 0 {
				withExtras++
			}
			if m := lookupOf(x, "e", gc.Tokens, ex); m.GPU != int32(n) {
				t.Fatalf("request keys matched %d of %d stored blocks (%+v)", m.GPU, n, m)
			}
			if ex.LoRA != "" || ex.CacheSalt != "" || len(ex.MM) > 0 {
				if m := lookupOf(x, "e", gc.Tokens, Extras{}); m.GPU == int32(n) {
					t.Fatal("keys without the extras must not match blocks stored with them")
				}
			}
		})
	}
	if withExtras < 5 {
		t.Fatalf("only %d golden cases exercise extras", withExtras)
	}
}

// jsonTuples converts JSON-decoded extra keys to the value types the msgpack
// decoder produces (string, int64, []any).
func jsonTuples(in [][]any) [][]any {
	if in == nil {
		return nil
	}
	out := make([][]any, len(in))
	for i, tup := range in {
		if tup == nil {
			continue
		}
		out[i] = convTuple(tup)
	}
	return out
}

func convTuple(in []any) []any {
	out := make([]any, len(in))
	for i, v := range in {
		switch x := v.(type) {
		case json.Number:
			n, _ := x.Int64()
			out[i] = n
		case []any:
			out[i] = convTuple(x)
		default:
			out[i] = v
		}
	}
	return out
}
