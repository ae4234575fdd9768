package tokenizer

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
)

// renderAnswer is a /v1/chat/completions/render answer in vLLM's shape
// (serve/disagg/protocol.py GenerateRequest) with the given features.
func renderAnswer(ids []uint32, features string) string {
	b, _ := json.Marshal(ids)
	return `{"request_id":"chatcmpl-1","token_ids":` + string(b) + `,"features":` + features +
		`,"sampling_params":{"max_tokens":16},"model":"m","stream":false,"cache_salt":null,"priority":0,"kv_transfer_params":null}`
}

// TestRemoteChatRenderedFeatures: the render answer's features, two
// modalities interleaved, come back as items sorted by offset (the engine's
// argsort_mm_positions order); text-only answers (features null) have none;
// the /tokenize fallback has none.
func TestRemoteChatRenderedFeatures(t *testing.T) {
	ids := make([]uint32, 40)
	features := `{"mm_hashes":{"image":["img-a","img-b"],"audio":["aud-c"]},` +
		`"mm_placeholders":{"image":[{"offset":2,"length":8},{"offset":30,"length":6}],"audio":[{"offset":12,"length":10}]},` +
		`"kwargs_data":null}`
	answer := renderAnswer(ids, features)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, answer)
	}))
	defer srv.Close()
	r, err := NewRemote(RemoteConfig{URL: srv.URL}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	req := ChatRequest{Messages: json.RawMessage(`[{"role":"user","content":"x"}]`)}
	got, err := r.ChatRendered(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	want := []MMItem{{"image", "img-a", 2, 8}, {"audio", "aud-c", 12, 10}, {"image", "img-b", 30, 6}}
	if !reflect.DeepEqual(got.MM, want) || len(got.IDs) != 40 {
		t.Fatalf("got %d ids, items %+v; want 40, %+v", len(got.IDs), got.MM, want)
	}
	answer = renderAnswer(ids, "null")
	if got, err = r.ChatRendered(context.Background(), req); err != nil || got.MM != nil {
		t.Fatalf("text-only: %+v, %v", got.MM, err)
	}
	answer = renderAnswer(ids, `{"mm_hashes":{"image":["a"]},"mm_placeholders":{"image":[{"offset":38,"length":8}]}}`)
	if _, err = r.ChatRendered(context.Background(), req); err == nil || !strings.Contains(err.Error(), "outside the prompt") {
		t.Fatalf("placeholder past the prompt: %v", err)
	}

	_, tsrv := newFakeEngine(t, false, func(string, map[string]json.RawMessage) []uint32 { return []uint32{1, 2, 3} })
	defer tsrv.Close()
	r2, err := NewRemote(RemoteConfig{URL: tsrv.URL}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := r2.ChatRendered(context.Background(), req); err != nil || got.MM != nil || len(got.IDs) != 3 {
		t.Fatalf("tokenize fallback: %+v, %v", got, err)
	}
}

func TestDecodeMMFeaturesErrors(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"not an object", `[1]`, "features:"},
		{"modalities differ", `{"mm_hashes":{"image":["a"]},"mm_placeholders":{}}`, "modalities"},
		{"modality missing", `{"mm_hashes":{"image":["a"]},"mm_placeholders":{"audio":[{"offset":0,"length":1}]}}`, "no placeholders"},
		{"counts differ", `{"mm_hashes":{"image":["a","b"]},"mm_placeholders":{"image":[{"offset":0,"length":1}]}}`, "2 hashes, 1 placeholders"},
		{"empty hash", `{"mm_hashes":{"image":[""]},"mm_placeholders":{"image":[{"offset":0,"length":1}]}}`, "empty"},
		{"no length", `{"mm_hashes":{"image":["a"]},"mm_placeholders":{"image":[{"offset":0}]}}`, "required"},
		{"zero length", `{"mm_hashes":{"image":["a"]},"mm_placeholders":{"image":[{"offset":0,"length":0}]}}`, "outside"},
		{"negative offset", `{"mm_hashes":{"image":["a"]},"mm_placeholders":{"image":[{"offset":-1,"length":2}]}}`, "outside"},
		{"overlap", `{"mm_hashes":{"image":["a","b"]},"mm_placeholders":{"image":[{"offset":0,"length":5},{"offset":4,"length":2}]}}`, "overlap"},
	} {
		if _, err := decodeMMFeatures(json.RawMessage(tc.in), 10); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want %q", tc.name, err, tc.want)
		}
	}
}

// FuzzMMFeatures: any bytes decode to an error or to items that are sorted,
// disjoint, non-empty and inside the prompt; never a panic.
func FuzzMMFeatures(f *testing.F) {
	f.Add([]byte(`{"mm_hashes":{"image":["a","b"]},"mm_placeholders":{"image":[{"offset":0,"length":5},{"offset":6,"length":2}]}}`), 10)
	f.Add([]byte(`null`), 0)
	f.Add([]byte(`{"mm_hashes":{},"mm_placeholders":{},"kwargs_data":{"image":[null]}}`), 3)
	f.Add([]byte(`{"mm_hashes":{"image":["a"]},"mm_placeholders":{"image":[{"offset":9223372036854775807,"length":9223372036854775807}]}}`), 10)
	f.Fuzz(func(t *testing.T, data []byte, n int) {
		items, err := decodeMMFeatures(data, n)
		if err != nil {
			return
		}
		end := 0
		for _, it := range items {
			if it.Identifier == "" || it.Length < 1 || it.Offset < end || it.Offset+it.Length > n {
				t.Fatalf("bad item %+v in %+v (n %d)", it, items, n)
			}
			end = it.Offset + it.Length
		}
	})
}
