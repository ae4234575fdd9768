package vllm

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"testing"
)

// eventCase is one case of testdata/vllm/events.json (see its README).
type eventCase struct {
	Name      string          `json:"name"`
	Encoding  string          `json:"encoding"`
	Valid     bool            `json:"valid"`
	Hex       string          `json:"hex"`
	Decoded   json.RawMessage `json:"decoded"`
	ErrorKind string          `json:"error_kind"`
	Unknown   []string        `json:"ignored_unknown_keys"`
}

func (c eventCase) payload(t testing.TB) []byte {
	b, err := hex.DecodeString(c.Hex)
	if err != nil {
		t.Fatalf("%s: bad hex: %v", c.Name, err)
	}
	return b
}

func loadEventCases(t testing.TB) []eventCase {
	raw, err := os.ReadFile("../../testdata/vllm/events.json")
	if err != nil {
		t.Fatal(err)
	}
	var cases []eventCase
	if err := json.Unmarshal(raw, &cases); err != nil {
		t.Fatal(err)
	}
	if len(cases) != 22 {
		t.Fatalf("events.json has %d cases, want 22", len(cases))
	}
	return cases
}

// normBatch renders a Batch the way events.json's "decoded" does: every
// field of the event's type, absent ones null, hashes as decimal strings.
// ts is left out (compared bit for bit separately).
func normBatch(b Batch) map[string]any {
	evs := make([]any, len(b.Events))
	for i, e := range b.Events {
		evs[i] = normEvent(e)
	}
	return map[string]any{"events": evs, "data_parallel_rank": b.DataParallelRank}
}

func normEvent(e Event) map[string]any {
	m := map[string]any{"type": e.Type.String()}
	if e.Type == AllBlocksCleared {
		return m
	}
	var hashes []string
	if e.BlockHashes != nil {
		hashes = make([]string, len(e.BlockHashes))
		for i, h := range e.BlockHashes {
			hashes[i] = strconv.FormatUint(uint64(h), 10)
		}
	}
	m["block_hashes"] = hashes
	m["medium"] = nilIfEmpty(e.Medium)
	m["group_idx"] = e.GroupIdx
	m["locality"] = nilIfEmpty(e.Locality)
	if e.Type == BlockRemoved {
		return m
	}
	var parent any
	if e.ParentBlockHash != nil {
		parent = strconv.FormatUint(uint64(*e.ParentBlockHash), 10)
	}
	m["parent_block_hash"] = parent
	m["token_ids"] = e.TokenIDs
	if e.TokenIDs == nil {
		m["token_ids"] = nil
	}
	m["block_size"] = e.BlockSize
	m["lora_id"] = e.LoRAID
	m["lora_name"] = e.LoRAName
	m["extra_keys"] = e.ExtraKeys
	m["kv_cache_spec_kind"] = nilIfEmpty(e.KVCacheSpecKind)
	m["kv_cache_spec_sliding_window"] = e.KVCacheSpecSlidingWindow
	return m
}

func nilIfEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// canonicalJSON re-encodes v (maps sorted, numbers verbatim).
func canonicalJSON(t *testing.T, v any) string {
	t.Helper()
	raw, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var x any
	if err := dec.Decode(&x); err != nil {
		t.Fatal(err)
	}
	out, err := json.Marshal(x)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// bytesHashesToU64 replaces the golden {"bytes_hex", "u64"} hash objects by
// their u64 string: Event keeps only the event value of a raw digest. It
// checks that u64 is indeed the digest's last 8 bytes.
func bytesHashesToU64(t *testing.T, v any) any {
	switch x := v.(type) {
	case map[string]any:
		if bh, ok := x["bytes_hex"].(string); ok {
			d, err := hex.DecodeString(bh)
			if err != nil {
				t.Fatal(err)
			}
			u, _ := x["u64"].(string)
			if got := strconv.FormatUint(uint64(EventValue(d)), 10); got != u {
				t.Errorf("golden u64 %s != EventValue(%s) %s", u, bh, got)
			}
			return u
		}
		for k, e := range x {
			x[k] = bytesHashesToU64(t, e)
		}
	case []any:
		for i, e := range x {
			x[i] = bytesHashesToU64(t, e)
		}
	}
	return v
}

func TestDecodeBatchGolden(t *testing.T) {
	for _, c := range loadEventCases(t) {
		t.Run(c.Name, func(t *testing.T) {
			b, err := DecodeBatch(c.payload(t))
			if !c.Valid {
				var de *DecodeError
				if !errors.Is(err, ErrMalformed) || !errors.As(err, &de) {
					t.Fatalf("invalid case (%s): err = %v, want a *DecodeError wrapping ErrMalformed", c.ErrorKind, err)
				}
				t.Logf("%s: %v", c.ErrorKind, err)
				return
			}
			if err != nil {
				t.Fatalf("DecodeBatch: %v", err)
			}
			dec := json.NewDecoder(bytes.NewReader(c.Decoded))
			dec.UseNumber()
			var want map[string]any
			if err := dec.Decode(&want); err != nil {
				t.Fatal(err)
			}
			wantTS, err := strconv.ParseFloat(string(want["ts"].(json.Number)), 64)
			if err != nil {
				t.Fatal(err)
			}
			if math.Float64bits(b.TS) != math.Float64bits(wantTS) {
				t.Errorf("ts = %v, want %v", b.TS, wantTS)
			}
			delete(want, "ts")
			got, wantJ := canonicalJSON(t, normBatch(b)), canonicalJSON(t, bytesHashesToU64(t, want))
			if got != wantJ {
				t.Errorf("decoded mismatch\n got: %s\nwant: %s", got, wantJ)
			}
		})
	}
}

// TestDecodeErrors checks that malformed payloads name the failing field and
// offset, unwrap to ErrMalformed and, where relevant, to the cause.
func TestDecodeErrors(t *testing.T) {
	golden := map[string][]byte{}
	for _, c := range loadEventCases(t) {
		golden[c.Name] = c.payload(t)
	}
	stored := golden["map-stored-no-parent"]
	tests := []struct {
		name    string
		payload []byte
		field   string
		offset  int
		cause   error
		msg     string
	}{
		{"empty", nil, "batch", 0, io.ErrUnexpectedEOF, "unexpected EOF"},
		{"not an array", []byte{0x80}, "batch", 0, nil, "expected array, got map"},
		{"short batch", []byte{0x91, 0x00}, "batch", 0, nil, "got 1 elements"},
		{"ts string", []byte{0x93, 0xa1, 'x', 0x90, 0x00}, "ts", 1, nil, "expected float, got str"},
		{"events nil", []byte{0x93, 0x00, 0xc0, 0x00}, "events", 2, nil, "got nil"},
		{"event scalar", []byte{0x93, 0x00, 0x91, 0x05, 0x00}, "events[0]", 3, nil, "map or an array, got int"},
		{"empty event array", []byte{0x93, 0x00, 0x91, 0x90, 0x00}, "events[0].type", 3, nil, "empty"},
		{"no type", []byte{0x93, 0x00, 0x91, 0x80, 0x00}, "events[0].type", 3, nil, "no \"type\""},
		{"negative rank", []byte{0x93, 0x00, 0x90, 0xff}, "data_parallel_rank", 3, nil, "out of range"},
		{"trailing", append(append([]byte{}, golden["map-empty-events"]...), 0x00), "batch", len(golden["map-empty-events"]), nil, "1 trailing bytes"},
		{"truncated", golden["malformed-truncated"], "events[0].block_hashes[1]", 52, io.ErrUnexpectedEOF, "unexpected EOF"},
		{"wrong type", golden["malformed-block-hashes-wrong-type"], "events[0].block_hashes", 42, nil, "expected array, got str"},
		{"unknown tag", golden["malformed-unknown-tag"], "events[0].type", 17, nil, `unknown event type "BlockMoved"`},
		{"huge array", []byte{0x93, 0x00, 0xdd, 0xff, 0xff, 0xff, 0xff}, "events", 2, io.ErrUnexpectedEOF, "only 0 bytes left"},
		{"token negative", patch(stored, []byte{0xdc, 0x00, 0x20, 0x01}, []byte{0xdc, 0x00, 0x20, 0xff}), "events[0].token_ids[0]", 93, nil, "out of range"},
		{"token too big", patch(stored, []byte{0xdc, 0x00, 0x20, 0x01, 0x02, 0x03, 0x04, 0x05}, []byte{0xdc, 0x00, 0x20, 0xcf, 1, 0, 0, 0, 0}), "events[0].token_ids[0]", 93, nil, "out of range"},
		{"deep unknown key", deepUnknown(100), "events[0].x", 0, nil, "nesting deeper"},
		{"nil hash", []byte{0x93, 0x00, 0x91, 0x92, 0xac, 'B', 'l', 'o', 'c', 'k', 'R', 'e', 'm', 'o', 'v', 'e', 'd', 0x91, 0xc0, 0x00}, "events[0].block_hashes[0]", 18, nil, "nil"},
		{"invalid code", []byte{0x93, 0x00, 0x91, 0x92, 0xb0, 'A', 'l', 'l', 'B', 'l', 'o', 'c', 'k', 's', 'C', 'l', 'e', 'a', 'r', 'e', 'd', 0xc1, 0x00}, "events[0].[1]", 21, nil, "0xc1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := DecodeBatch(tt.payload)
			var de *DecodeError
			if !errors.As(err, &de) || !errors.Is(err, ErrMalformed) {
				t.Fatalf("err = %v, want *DecodeError wrapping ErrMalformed", err)
			}
			if de.Field != tt.field || (tt.offset != 0 && de.Offset != tt.offset) {
				t.Errorf("at %s offset %d, want %s offset %d (%v)", de.Field, de.Offset, tt.field, tt.offset, err)
			}
			if tt.cause != nil && !errors.Is(err, tt.cause) {
				t.Errorf("err = %v, want it to wrap %v", err, tt.cause)
			}
			if !strings.Contains(err.Error(), tt.msg) || !strings.HasPrefix(err.Error(), "decode "+tt.field+" ") {
				t.Errorf("err = %q, want prefix %q and %q", err, "decode "+tt.field, tt.msg)
			}
		})
	}
}

// patch returns a copy of b with the first occurrence of old replaced.
func patch(b, old, new []byte) []byte {
	i := bytes.Index(b, old)
	if i < 0 {
		panic("patch: pattern not found")
	}
	return append(append(append([]byte{}, b[:i]...), new...), b[i+len(old):]...)
}

// deepUnknown is a batch with one AllBlocksCleared map event carrying an
// unknown key "x" whose value nests n arrays deep.
func deepUnknown(n int) []byte {
	b := []byte{0x93, 0x00, 0x91, 0x82, 0xa4, 't', 'y', 'p', 'e', 0xb0}
	b = append(b, "AllBlocksCleared"...)
	b = append(b, 0xa1, 'x')
	for range n {
		b = append(b, 0x91)
	}
	return append(b, 0x00, 0x00)
}

// TestDecodeTolerance covers layouts the golden file does not: fields out of
// order, the tag after other fields, unknown keys of every type, hashes as
// negative int64 and short bin, and arrays longer than today's.
func TestDecodeTolerance(t *testing.T) {
	type kv struct {
		k string
		v []byte
	}
	mapEvent := func(entries ...kv) []byte {
		b := []byte{0x93, 0xcb, 0x3f, 0xf0, 0, 0, 0, 0, 0, 0, 0x91, 0x80 | byte(len(entries))}
		for _, e := range entries {
			b = append(b, 0xa0|byte(len(e.k)))
			b = append(b, e.k...)
			b = append(b, e.v...)
		}
		return append(b, 0x01)
	}
	str := func(s string) []byte { return append([]byte{0xa0 | byte(len(s))}, s...) }
	tests := []struct {
		name    string
		payload []byte
		want    Event
	}{
		{"type last, removed drops stored-only fields",
			mapEvent(kv{"token_ids", []byte{0x91, 0x05}}, kv{"block_hashes", []byte{0x91, 0xd3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe}}, kv{"type", str("BlockRemoved")}),
			Event{Type: BlockRemoved, BlockHashes: []BlockHash{math.MaxUint64 - 1}}},
		{"unknown keys of every type skipped",
			mapEvent(kv{"type", str("BlockRemoved")}, kv{"a", []byte{0x82, 0x01, 0x02, 0xa1, 'x', 0x92, 0xc3, 0xca, 0, 0, 0, 0}}, kv{"b", []byte{0xc4, 0x02, 0xaa, 0xbb}}, kv{"c", []byte{0xd4, 0x01, 0x02}}, kv{"d", []byte{0xc7, 0x02, 0x05, 0x01, 0x02}}, kv{"block_hashes", []byte{0x91, 0xc4, 0x02, 0x01, 0x02}}),
			Event{Type: BlockRemoved, BlockHashes: []BlockHash{0x0102}}},
		{"negative fixint hash",
			mapEvent(kv{"type", str("BlockRemoved")}, kv{"block_hashes", []byte{0x91, 0xff}}, kv{"medium", str("STORAGE")}),
			Event{Type: BlockRemoved, BlockHashes: []BlockHash{math.MaxUint64}, Medium: "STORAGE"}},
		{"longer array than today",
			[]byte{0x93, 0x00, 0x91, 0x96, 0xac, 'B', 'l', 'o', 'c', 'k', 'R', 'e', 'm', 'o', 'v', 'e', 'd', 0x91, 0x07, 0xc0, 0x02, 0xa5, 'L', 'O', 'C', 'A', 'L', 0x93, 0x01, 0x02, 0x03, 0x01},
			Event{Type: BlockRemoved, BlockHashes: []BlockHash{7}, GroupIdx: ptr(2), Locality: "LOCAL"}},
		{"v0.9 array, shortest layout",
			[]byte{0x93, 0x00, 0x91, 0x96, 0xab, 'B', 'l', 'o', 'c', 'k', 'S', 't', 'o', 'r', 'e', 'd', 0x91, 0x07, 0x05, 0x92, 0x01, 0x02, 0x02, 0xc0, 0x01},
			Event{Type: BlockStored, BlockHashes: []BlockHash{7}, ParentBlockHash: ptr(BlockHash(5)), TokenIDs: []uint32{1, 2}, BlockSize: 2}},
		// llm-d-inference-sim's default: positional, parent 0 for none.
		{"positional parent 0 is no parent",
			[]byte{0x93, 0x00, 0x91, 0x96, 0xab, 'B', 'l', 'o', 'c', 'k', 'S', 't', 'o', 'r', 'e', 'd', 0x91, 0x07, 0x00, 0x92, 0x01, 0x02, 0x02, 0xc0, 0x01},
			Event{Type: BlockStored, BlockHashes: []BlockHash{7}, TokenIDs: []uint32{1, 2}, BlockSize: 2}},
		{"map parent 0 is no parent",
			mapEvent(kv{"type", str("BlockStored")}, kv{"block_hashes", []byte{0x91, 0x07}}, kv{"parent_block_hash", []byte{0x00}}),
			Event{Type: BlockStored, BlockHashes: []BlockHash{7}}},
		{"empty bin parent is no parent",
			mapEvent(kv{"type", str("BlockStored")}, kv{"block_hashes", []byte{0x91, 0x07}}, kv{"parent_block_hash", []byte{0xc4, 0x00}}),
			Event{Type: BlockStored, BlockHashes: []BlockHash{7}}},
		{"extra keys with bytes, bool, float, big uint",
			mapEvent(kv{"type", str("BlockStored")}, kv{"extra_keys", []byte{0x92, 0xc0, 0x94, 0xc4, 0x01, 0xaa, 0xc2, 0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0, 0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}}),
			Event{Type: BlockStored, ExtraKeys: [][]any{nil, {[]byte{0xaa}, false, 1.5, uint64(math.MaxUint64)}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := DecodeBatch(tt.payload)
			if err != nil {
				t.Fatal(err)
			}
			if len(b.Events) != 1 {
				t.Fatalf("%d events", len(b.Events))
			}
			got, want := canonicalJSON(t, normEvent(b.Events[0])), canonicalJSON(t, normEvent(tt.want))
			if got != want {
				t.Errorf("\n got %s\nwant %s", got, want)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }
