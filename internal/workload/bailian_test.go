package workload

import (
	"errors"
	"strings"
	"testing"
)

// The lines below are synthetic: written for these tests in the layout the
// Qwen-Bailian trace README documents (alibaba-edu/qwen-bailian-usagetraces-
// anon, "Data Specification of the Traces": chat_id, parent_chat_id with -1
// for a root, timestamp in seconds, input_length, output_length, type, turn,
// hash_ids over 16-token blocks). The release's trace files are stored in
// Git LFS and were not available to check against; no line here is real
// trace data.
const syntheticBailian = `{"chat_id": 7, "parent_chat_id": -1, "timestamp": 0.5, "input_length": 40, "output_length": 12, "type": "text", "turn": 1, "hash_ids": [1, 2, 3]}
{"chat_id": 9, "parent_chat_id": -1, "timestamp": 1.25, "input_length": 16, "output_length": 3, "type": "search", "turn": 1, "hash_ids": [50]}
{"chat_id": 8, "parent_chat_id": 7, "timestamp": 3.0005, "input_length": 70, "output_length": 5, "type": "text", "turn": 2, "hash_ids": [1, 2, 4, 5, 6]}

{"chat_id": 11, "parent_chat_id": 8, "timestamp": 4, "input_length": 90, "output_length": 0, "type": "text", "turn": 3, "hash_ids": [1, 2, 4, 5, 7, 8]}
{"chat_id": 12, "parent_chat_id": 99, "timestamp": 5, "input_length": 1, "output_length": 1, "turn": 4, "hash_ids": [60]}
`

func TestReadTraceBailian(t *testing.T) {
	recs, err := ReadTrace(strings.NewReader(syntheticBailian))
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		ts      int64
		session string
		turn    int
	}{{500, "chat-7", 1}, {1250, "chat-9", 1}, {3001, "chat-7", 2}, {4000, "chat-7", 3}, {5000, "chat-99", 4}}
	if len(recs) != len(want) {
		t.Fatalf("%d records, want %d", len(recs), len(want))
	}
	for i, w := range want {
		r := recs[i]
		if r.Timestamp != w.ts || r.SessionID != w.session || r.Turn != w.turn || r.BlockTokens != BailianBlockTokens {
			t.Errorf("record %d = %+v, want timestamp %d ms, session %s, turn %d, 16-token blocks", i, r, w.ts, w.session, w.turn)
		}
	}
	w, err := Mooncake(recs, MooncakeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Record 0 (40 tokens: 16+16+8) and record 2 (70 tokens) share their
	// first two blocks, 32 tokens, and no more; the conversation is one
	// session.
	a, b := w.Requests[0], w.Requests[2]
	if a.InputTokens() != 40 || b.InputTokens() != 70 || a.Session != "chat-7" || b.Session != "chat-7" {
		t.Fatalf("requests %+v / %+v", a, b)
	}
	ta, tb := a.Tokens(), b.Tokens()
	common := 0
	for common < len(ta) && ta[common] == tb[common] {
		common++
	}
	if common != 32 {
		t.Errorf("records 0 and 2 share %d leading tokens, want 32", common)
	}
	// Bailian id 1 and Mooncake id 1 are different blocks.
	m, err := Mooncake([]TraceRecord{{InputLength: 16, HashIDs: []int64{1}}}, MooncakeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if mt := m.Requests[0].Tokens(); mt[0] == ta[0] && mt[1] == ta[1] && mt[2] == ta[2] {
		t.Errorf("Mooncake id 1 and Bailian id 1 expand to the same tokens")
	}
}

func TestParseTraceLineSessions(t *testing.T) {
	for _, c := range []struct {
		name, line, session string
		ok                  bool
	}{
		{"mooncake string session", `{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [4], "session_id": "conv-3"}`, "conv-3", true},
		{"mooncake integer session", `{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [4], "session_id": 17}`, "17", true},
		{"mooncake empty session", `{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [4], "session_id": ""}`, "", false},
		{"mooncake object session", `{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [4], "session_id": {}}`, "", false},
		{"mooncake long session", `{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [4], "session_id": "` + strings.Repeat("x", 257) + `"}`, "", false},
		{"bailian", `{"chat_id": 1, "parent_chat_id": -1, "timestamp": 0, "input_length": 17, "output_length": 1, "turn": 1, "hash_ids": [4, 5]}`, "", true},
		{"bailian 512-token ids", `{"chat_id": 1, "parent_chat_id": -1, "timestamp": 0, "input_length": 17, "output_length": 1, "turn": 1, "hash_ids": [4]}`, "", false},
		{"bailian missing parent", `{"chat_id": 1, "timestamp": 0, "input_length": 1, "output_length": 1, "turn": 1, "hash_ids": [4]}`, "", false},
		{"bailian missing turn", `{"chat_id": 1, "parent_chat_id": -1, "timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [4]}`, "", false},
		{"bailian parent -2", `{"chat_id": 1, "parent_chat_id": -2, "timestamp": 0, "input_length": 1, "output_length": 1, "turn": 1, "hash_ids": [4]}`, "", false},
		{"bailian negative chat", `{"chat_id": -1, "parent_chat_id": -1, "timestamp": 0, "input_length": 1, "output_length": 1, "turn": 1, "hash_ids": [4]}`, "", false},
		{"bailian huge timestamp", `{"chat_id": 1, "parent_chat_id": -1, "timestamp": 1e300, "input_length": 1, "output_length": 1, "turn": 1, "hash_ids": [4]}`, "", false},
		{"bailian string chat", `{"chat_id": "a", "parent_chat_id": -1, "timestamp": 0, "input_length": 1, "output_length": 1, "turn": 1, "hash_ids": [4]}`, "", false},
		{"bailian null chat", `{"chat_id": null, "parent_chat_id": -1, "timestamp": 0, "input_length": 1, "output_length": 1, "turn": 1, "hash_ids": [4]}`, "", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, err := ParseTraceLine([]byte(c.line))
			if !c.ok {
				if !errors.Is(err, ErrMalformed) {
					t.Fatalf("error = %v, want ErrMalformed", err)
				}
				return
			}
			if err != nil || r.SessionID != c.session {
				t.Fatalf("record %+v, %v; want session %q", r, err, c.session)
			}
		})
	}
}
