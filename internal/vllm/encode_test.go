package vllm

import (
	"bytes"
	"encoding/hex"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// TestAppendBatchGolden decodes every valid golden payload and re-encodes
// it. Where vLLM's bytes are reproducible they must match exactly; the
// exceptions are listed with the reason. In every case the re-encoded bytes
// must decode to the same Batch.
func TestAppendBatchGolden(t *testing.T) {
	notIdentical := map[string]string{
		"map-hashes-as-bytes":       "raw-digest hashes (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0) are reduced to their event value; AppendBatch writes ints",
		"map-unknown-key-ownership": "the unknown key is skipped by the decoder, so it is not re-encoded",
		"array-v0.14-stored-removed": "LayoutArray writes the v0.22-v0.23 field set (11 BlockStored fields), " +
			"not v0.14's 7; missing fields come back as nil",
	}
	identical := 0
	for _, c := range loadEventCases(t) {
		if !c.Valid {
			continue
		}
		t.Run(c.Name, func(t *testing.T) {
			payload := c.payload(t)
			b, err := DecodeBatch(payload)
			if err != nil {
				t.Fatal(err)
			}
			layout := LayoutMap
			if c.Encoding == "array" {
				layout = LayoutArray
			}
			got, err := AppendBatch(nil, &b, layout)
			if err != nil {
				t.Fatal(err)
			}
			if why, ok := notIdentical[c.Name]; ok {
				t.Logf("not byte-identical by design: %s", why)
			} else if !bytes.Equal(got, payload) {
				t.Fatalf("re-encoded bytes differ\n got %x\nwant %x", got, payload)
			} else {
				identical++
			}
			b2, err := DecodeBatch(got)
			if err != nil {
				t.Fatalf("decode re-encoded: %v", err)
			}
			if !reflect.DeepEqual(b, b2) {
				t.Errorf("round trip changed the batch\n got %+v\nwant %+v", b2, b)
			}
		})
	}
	if want := 19 - len(notIdentical); identical != want {
		t.Errorf("%d byte-identical cases, want %d", identical, want)
	}
}

// TestAppendBatchArrayOfMapCases writes map-layout golden batches in the
// array layout and checks they decode back unchanged (no locality in them)
// or are refused (locality set).
func TestAppendBatchArrayOfMapCases(t *testing.T) {
	for _, c := range loadEventCases(t) {
		if !c.Valid || c.Encoding != "map" {
			continue
		}
		b, err := DecodeBatch(c.payload(t))
		if err != nil {
			t.Fatal(err)
		}
		hasLocality := false
		for _, e := range b.Events {
			hasLocality = hasLocality || e.Locality != ""
		}
		got, err := AppendBatch(nil, &b, LayoutArray)
		if hasLocality {
			if err == nil || !strings.Contains(err.Error(), "locality") {
				t.Errorf("%s: err = %v, want a locality error", c.Name, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", c.Name, err)
		}
		b2, err := DecodeBatch(got)
		if err != nil {
			t.Fatalf("%s: %v", c.Name, err)
		}
		if !reflect.DeepEqual(b, b2) {
			t.Errorf("%s: array round trip changed the batch", c.Name)
		}
	}
}

func TestAppendBatchErrors(t *testing.T) {
	tests := []struct {
		name   string
		b      Batch
		layout Layout
		msg    string
	}{
		{"unknown type", Batch{Events: []Event{{Type: 9}}}, LayoutMap, "encode events[0]: unknown event type EventType(9)"},
		{"unknown type array", Batch{Events: []Event{{}, {Type: 0}}}, LayoutArray, "encode events[0]: unknown event type"},
		{"bad extra key", Batch{Events: []Event{{Type: BlockStored, ExtraKeys: [][]any{{struct{}{}}}}}}, LayoutMap, "extra_keys[0]: unsupported extra key item of type struct {}"},
		{"locality in array", Batch{Events: []Event{{Type: BlockRemoved, Locality: "LOCAL"}}}, LayoutArray, "locality"},
		{"bad layout", Batch{}, Layout(7), "unknown layout 7"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := AppendBatch(nil, &tt.b, tt.layout)
			if err == nil || !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("err = %v, want %q", err, tt.msg)
			}
		})
	}
}

// TestAppendIntForms checks the smallest-form integer encoding at every
// boundary against msgpack-python's choices (unsigned when >= 0) and that
// vmihailenco/msgpack reads the value back.
func TestAppendIntForms(t *testing.T) {
	tests := []struct {
		v    int64
		want string
	}{
		{0, "00"}, {127, "7f"}, {128, "cc80"}, {255, "ccff"}, {256, "cd0100"},
		{65535, "cdffff"}, {65536, "ce00010000"}, {math.MaxUint32, "ceffffffff"},
		{math.MaxUint32 + 1, "cf0000000100000000"}, {-1, "ff"}, {-32, "e0"},
		{-33, "d0df"}, {-128, "d080"}, {-129, "d1ff7f"}, {-32768, "d18000"},
		{-32769, "d2ffff7fff"}, {math.MinInt32, "d280000000"},
		{math.MinInt32 - 1, "d3ffffffff7fffffff"}, {math.MinInt64, "d38000000000000000"},
	}
	for _, tt := range tests {
		got := appendInt(nil, tt.v)
		if hex.EncodeToString(got) != tt.want {
			t.Errorf("appendInt(%d) = %x, want %s", tt.v, got, tt.want)
		}
		var back int64
		if err := msgpack.Unmarshal(got, &back); err != nil || back != tt.v {
			t.Errorf("msgpack reads %x as %d, %v; want %d", got, back, err, tt.v)
		}
	}
	for _, n := range []int{0, 31, 32, 255, 256, 65536} {
		s := strings.Repeat("x", n)
		var back string
		if err := msgpack.Unmarshal(appendStr(nil, s), &back); err != nil || back != s {
			t.Errorf("appendStr(len %d) does not round-trip: %v", n, err)
		}
		var bb []byte
		if err := msgpack.Unmarshal(appendBin(nil, []byte(s)), &bb); err != nil || string(bb) != s {
			t.Errorf("appendBin(len %d) does not round-trip: %v", n, err)
		}
	}
	for _, tt := range []struct{ n, size int }{{0, 1}, {15, 1}, {16, 3}, {65535, 3}, {65536, 5}} {
		if got := appendArrayLen(nil, tt.n); len(got) != tt.size {
			t.Errorf("appendArrayLen(%d) = %x, want %d bytes", tt.n, got, tt.size)
		}
		if got := appendMapLen(nil, tt.n); len(got) != tt.size {
			t.Errorf("appendMapLen(%d) = %x, want %d bytes", tt.n, got, tt.size)
		}
	}
	for k, want := range map[string]string{keyType: "type", keySlidingWindow: "kv_cache_spec_sliding_window", tagAllBlocksClear: "AllBlocksCleared"} {
		if string(appendStr(nil, want)) != k {
			t.Errorf("pre-encoded key %q != appendStr(%q)", k, want)
		}
	}
}

// TestAppendBatchNoAllocs: with capacity in dst, encoding allocates nothing.
func TestAppendBatchNoAllocs(t *testing.T) {
	b := typicalBatch()
	buf := make([]byte, 0, 8192)
	allocs := testing.AllocsPerRun(100, func() {
		var err error
		if buf, err = AppendBatch(buf[:0], &b, LayoutMap); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("AppendBatch allocates %v times per call, want 0", allocs)
	}
}

// typicalBatch is one BlockStored of 32 blocks x 16 tokens, as a plain-text
// request produces it on vLLM main (used by tests and benchmarks).
func typicalBatch() Batch {
	const blocks, bs = 32, 16
	e := Event{Type: BlockStored, BlockSize: bs, Medium: "GPU", GroupIdx: ptr(0), KVCacheSpecKind: FullAttention}
	for i := range blocks {
		e.BlockHashes = append(e.BlockHashes, BlockHash(0x9e3779b97f4a7c15*uint64(i+1)))
		e.ExtraKeys = append(e.ExtraKeys, nil)
		for j := range bs {
			e.TokenIDs = append(e.TokenIDs, uint32(1000+i*bs+j*7919%151000))
		}
	}
	return Batch{TS: 1754530954.123456, Events: []Event{e}}
}
