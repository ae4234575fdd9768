package enginesim

import (
	"encoding/json"
	"os"
	"reflect"
	"strconv"
	"testing"

	"kvrouter/internal/vllm"
)

// blockhashCase is one case of testdata/vllm/blockhash.json (golden vectors
// produced by vLLM's own code).
type blockhashCase struct {
	Name      string   `json:"name"`
	Algo      string   `json:"algo"`
	Seed      string   `json:"pythonhashseed"`
	BlockSize int      `json:"block_size"`
	Tokens    []uint32 `json:"tokens"`
	Request   struct {
		LoRAName  *string `json:"lora_name"`
		CacheSalt *string `json:"cache_salt"`
		MM        []struct {
			Identifier string `json:"identifier"`
			Offset     int    `json:"offset"`
			Length     int    `json:"length"`
		} `json:"mm_features"`
	} `json:"request"`
	ExtraKeys   []any    `json:"extra_keys_per_block"`
	EventValues []string `json:"event_values"`
}

func loadBlockhashCases(t testing.TB) []blockhashCase {
	t.Helper()
	b, err := os.ReadFile("../../testdata/vllm/blockhash.json")
	if err != nil {
		t.Fatal(err)
	}
	var cases []blockhashCase
	if err := json.Unmarshal(b, &cases); err != nil {
		t.Fatal(err)
	}
	return cases
}

// TestGoldenEventsThroughWire: the core, hashing with vLLM's algorithms
// (internal/vllm), emits for every golden prompt exactly the golden event
// values and extra keys (multimodal items included), and the batch survives vLLM's wire encoding
// (AppendBatch, map and legacy array layouts) and DecodeBatch unchanged.
func TestGoldenEventsThroughWire(t *testing.T) {
	ran, mm := 0, 0
	for _, tc := range loadBlockhashCases(t) {
		t.Run(tc.Name, func(t *testing.T) {
			h, err := vllm.NewBlockHasher(vllm.HashAlgo(tc.Algo), tc.Seed, nil)
			if err != nil {
				t.Fatal(err)
			}
			c := newTestCore(t, CoreConfig{BlockSize: tc.BlockSize, NumGPUBlocks: 64, MaxModelLen: 32 * tc.BlockSize, Hasher: h})
			r := &Request{ID: "g", Tokens: tc.Tokens, MaxTokens: 1}
			if tc.Request.LoRAName != nil {
				r.LoRAName = *tc.Request.LoRAName
			}
			if tc.Request.CacheSalt != nil {
				r.CacheSalt = *tc.Request.CacheSalt
			}
			for _, f := range tc.Request.MM {
				r.MM = append(r.MM, vllm.MMFeature{Identifier: f.Identifier, Offset: f.Offset, Length: f.Length})
			}
			if len(r.MM) > 0 {
				mm++
			}
			mustSubmit(t, c, r)
			s := step(c)
			var got []vllm.BlockHash
			var keys [][]any
			for _, e := range s.events {
				got = append(got, e.BlockHashes...)
				keys = append(keys, e.ExtraKeys...)
			}
			if len(got) != len(tc.EventValues) {
				t.Fatalf("%d hashes, want %d", len(got), len(tc.EventValues))
			}
			for i, v := range tc.EventValues {
				want, _ := strconv.ParseUint(v, 10, 64)
				if uint64(got[i]) != want {
					t.Errorf("block %d: hash %d, want %d", i, got[i], want)
				}
			}
			wantKeys, _ := json.Marshal(tc.ExtraKeys)
			gotKeys, _ := json.Marshal(keys)
			if len(tc.EventValues) > 0 && string(wantKeys) != string(gotKeys) {
				t.Errorf("extra keys %s, want %s", gotKeys, wantKeys)
			}
			if len(s.events) == 0 {
				return
			}
			for _, layout := range []vllm.Layout{vllm.LayoutMap, vllm.LayoutArray} {
				b := vllm.Batch{TS: 1754530954.5, Events: s.events, DataParallelRank: 2}
				payload, err := vllm.AppendBatch(nil, &b, layout)
				if err != nil {
					t.Fatal(err)
				}
				dec, err := vllm.DecodeBatch(payload)
				if err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(normalizeBatch(dec), normalizeBatch(b)) {
					t.Errorf("%v round trip:\n got %+v\nwant %+v", layout, dec, b)
				}
			}
		})
		ran++
	}
	if ran < 15 || mm < 6 {
		t.Fatalf("only %d golden cases ran, %d with multimodal items", ran, mm)
	}
}

// normalizeBatch makes decoded and original batches comparable: the
// decoder reads extra-key strings back as string and ints as int64.
func normalizeBatch(b vllm.Batch) string {
	out, _ := json.Marshal(b)
	return string(out)
}
