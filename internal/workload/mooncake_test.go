package workload

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"os"
	"reflect"
	"strings"
	"sync"
	"testing"
)

const tracePath = "../../testdata/mooncake/conversation_trace.jsonl.gz"

var loadTrace = sync.OnceValues(func() ([]TraceRecord, error) {
	f, err := os.Open(tracePath)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ReadTrace(f)
})

func trace(t testing.TB) []TraceRecord {
	t.Helper()
	recs, err := loadTrace()
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

func TestReadTraceConversation(t *testing.T) {
	recs := trace(t)
	if len(recs) != 12031 {
		t.Fatalf("records = %d, want 12031 (testdata/mooncake/README.md)", len(recs))
	}
	first := TraceRecord{Timestamp: 0, InputLength: 6758, OutputLength: 500, HashIDs: []int64{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13}}
	if !reflect.DeepEqual(recs[0], first) {
		t.Errorf("first record = %+v, want %+v", recs[0], first)
	}
	last := recs[len(recs)-1]
	if last.Timestamp != 3536999 || last.InputLength != 20774 || last.OutputLength != 508 || len(last.HashIDs) != 41 {
		t.Errorf("last record = %+v", last)
	}
	for i, r := range recs {
		if r.HashIDs[0] != 0 {
			t.Fatalf("record %d does not start with the shared block 0", i)
		}
		if i > 0 && r.Timestamp < recs[i-1].Timestamp {
			t.Fatalf("record %d goes back in time", i)
		}
	}
}

func TestReadTracePlainAndErrors(t *testing.T) {
	good := `{"timestamp": 5, "input_length": 513, "output_length": 2, "hash_ids": [7, 9]}`
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write([]byte(good + "\n\n" + good + "\n"))
	zw.Close()
	for name, in := range map[string][]byte{"plain": []byte(good + "\n\n" + good), "gzip": gz.Bytes()} {
		recs, err := ReadTrace(bytes.NewReader(in))
		if err != nil || len(recs) != 2 || recs[1].InputLength != 513 {
			t.Errorf("%s: got %v, %v", name, recs, err)
		}
	}
	_, err := ReadTrace(strings.NewReader(good + "\n" + `{"timestamp": 5}` + "\n"))
	if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "line 2") {
		t.Errorf("error = %v, want ErrMalformed naming line 2", err)
	}
}

func TestParseTraceLine(t *testing.T) {
	cases := []struct {
		name, line string
		ok         bool
	}{
		{"full", `{"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [0, 1]}`, true},
		{"partial last block", `{"timestamp": 3, "input_length": 1025, "output_length": 0, "hash_ids": [0, 1, 2]}`, true},
		{"unknown field", `{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [4], "x": 1}`, true},
		{"missing timestamp", `{"input_length": 1, "output_length": 1, "hash_ids": [4]}`, false},
		{"missing hash_ids", `{"timestamp": 0, "input_length": 1, "output_length": 1}`, false},
		{"too few ids", `{"timestamp": 0, "input_length": 513, "output_length": 1, "hash_ids": [4]}`, false},
		{"too many ids", `{"timestamp": 0, "input_length": 512, "output_length": 1, "hash_ids": [4, 5]}`, false},
		{"zero input", `{"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": []}`, false},
		{"negative id", `{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [-1]}`, false},
		{"negative time", `{"timestamp": -1, "input_length": 1, "output_length": 1, "hash_ids": [1]}`, false},
		{"negative output", `{"timestamp": 0, "input_length": 1, "output_length": -1, "hash_ids": [1]}`, false},
		{"huge input", `{"timestamp": 0, "input_length": 99999999999, "output_length": 1, "hash_ids": [1]}`, false},
		{"float length", `{"timestamp": 0, "input_length": 1.5, "output_length": 1, "hash_ids": [1]}`, false},
		{"not json", `timestamp=0`, false},
		{"array", `[0, 1, 1, [1]]`, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseTraceLine([]byte(c.line))
			if c.ok && err != nil {
				t.Fatalf("unexpected error %v", err)
			}
			if !c.ok && !errors.Is(err, ErrMalformed) {
				t.Fatalf("error = %v, want ErrMalformed", err)
			}
		})
	}
}

// FuzzParseTraceLine checks that any input either fails with ErrMalformed or
// decodes to a record that satisfies the format's invariants and survives a
// JSON round trip unchanged.
func FuzzParseTraceLine(f *testing.F) {
	for _, r := range trace(f)[:64] {
		b, _ := json.Marshal(r)
		f.Add(b)
	}
	f.Add([]byte(`{"timestamp": 0, "input_length": 1025, "output_length": 0, "hash_ids": [0, 1, 2]}`))
	f.Add([]byte(`{"timestamp": 1e3, "input_length": 1, "output_length": 1, "hash_ids": [72057594037927935]}`))
	f.Add([]byte(`{}`))
	f.Add([]byte(`null`))
	f.Add([]byte(`{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [4], "session_id": 17}`))
	f.Add([]byte(`{"chat_id": 8, "parent_chat_id": 7, "timestamp": 3.0005, "input_length": 70, "output_length": 5, "type": "text", "turn": 2, "hash_ids": [1, 2, 4, 5, 6]}`))
	f.Fuzz(func(t *testing.T, line []byte) {
		r, err := ParseTraceLine(line)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			return
		}
		if r.BlockTokens == BailianBlockTokens {
			if len(r.HashIDs) != (r.InputLength+15)/16 || r.Timestamp < 0 || r.OutputLength < 0 || r.ChatID < 0 || r.ParentChatID < -1 {
				t.Fatalf("accepted invalid Bailian record %+v", r)
			}
			return // its seconds and chat ids do not marshal back to the same layout
		}
		if len(r.HashIDs) != (r.InputLength+511)/512 || r.Timestamp < 0 || r.OutputLength < 0 || len(r.SessionID) > 256 {
			t.Fatalf("accepted invalid record %+v", r)
		}
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		r2, err := ParseTraceLine(b)
		if err != nil || !reflect.DeepEqual(r, r2) {
			t.Fatalf("round trip: %+v -> %s -> %+v, %v", r, b, r2, err)
		}
	})
}

// TestMooncakeExpansionCollisionFree proves the expansion's two properties
// on the whole conversation trace: every distinct hash id expands to a
// distinct block (its first four tokens already differ, which the
// bijective key digits guarantee and this checks for all 182,790 ids; the
// first 20,000 full blocks are also compared whole), and every occurrence
// of an id expands to the same tokens, so two prompts share exactly the
// tokens of their common leading ids.
func TestMooncakeExpansionCollisionFree(t *testing.T) {
	recs := trace(t)
	w, err := Mooncake(recs, MooncakeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	heads := map[[keyDigits]uint32]int64{} // first tokens -> hash id
	whole := map[string]int64{}            // whole block -> hash id
	block := make([]uint32, 0, MooncakeBlockTokens)
	for i, r := range recs {
		for j, h := range r.HashIDs {
			seg := w.Requests[i].Prompt[j]
			var head [keyDigits]uint32
			copy(head[:], Segment{seg.Key, keyDigits}.AppendTokens(block[:0]))
			if prev, ok := heads[head]; ok && prev != h {
				t.Fatalf("hash ids %d and %d start with the same tokens", prev, h)
			}
			heads[head] = h
			if seg.Len != MooncakeBlockTokens || len(whole) >= 20000 {
				continue
			}
			block = seg.AppendTokens(block[:0])
			k := string(u32bytes(block))
			if prev, ok := whole[k]; ok && prev != h {
				t.Fatalf("hash ids %d and %d expand to the same tokens", prev, h)
			}
			whole[k] = h
		}
	}
	if len(heads) != 182790 {
		t.Fatalf("%d distinct ids checked, want 182790", len(heads))
	}
	// Common prefixes: consecutive requests share exactly their common ids.
	for i := 1; i < 2000; i++ {
		a, b := recs[i-1], recs[i]
		common := 0
		for common < min(len(a.HashIDs), len(b.HashIDs)) && a.HashIDs[common] == b.HashIDs[common] {
			common++
		}
		ta, tb := w.Requests[i-1].Tokens(), w.Requests[i].Tokens()
		if len(ta) != a.InputLength || len(tb) != b.InputLength {
			t.Fatalf("token lengths %d, %d; want %d, %d", len(ta), len(tb), a.InputLength, b.InputLength)
		}
		n := 0
		for n < min(len(ta), len(tb)) && ta[n] == tb[n] {
			n++
		}
		full := common * MooncakeBlockTokens
		if n < min(full, len(ta), len(tb)) || (n >= full+keyDigits && n < min(len(ta), len(tb))) {
			t.Fatalf("requests %d,%d share %d ids but %d tokens", i-1, i, common, n)
		}
	}
}

func u32bytes(v []uint32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		b[4*i], b[4*i+1], b[4*i+2], b[4*i+3] = byte(x), byte(x>>8), byte(x>>16), byte(x>>24)
	}
	return b
}

func TestMooncakeOptions(t *testing.T) {
	recs := trace(t)
	w, err := Mooncake(recs, MooncakeOptions{Speed: 10, Skip: 100, Limit: 50, MaxInputTokens: 2000, MaxOutputTokens: 64})
	if err != nil {
		t.Fatal(err)
	}
	if len(w.Requests) != 50 || w.Requests[0].ID != "mooncake-000100" || w.Requests[0].At != 0 {
		t.Fatalf("slice: %d requests, first %s at %v", len(w.Requests), w.Requests[0].ID, w.Requests[0].At)
	}
	for i, r := range w.Requests {
		rec := recs[100+i]
		if want := min(rec.InputLength, 2000); r.InputTokens() != want {
			t.Errorf("%s: %d input tokens, want %d", r.ID, r.InputTokens(), want)
		}
		if r.OutputTokens != min(rec.OutputLength, 64) {
			t.Errorf("%s: output %d", r.ID, r.OutputTokens)
		}
		wantAt := float64(rec.Timestamp-recs[100].Timestamp) / 10 // ms
		if got := float64(r.At.Microseconds()) / 1000; got < wantAt-0.01 || got > wantAt+0.01 {
			t.Errorf("%s: at %v ms, want %v", r.ID, got, wantAt)
		}
	}
	if _, err := Mooncake(recs, MooncakeOptions{Speed: -1}); err == nil {
		t.Error("negative speed accepted")
	}
}
