package request

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"kvrouter/internal/tokenizer"
)

// FuzzHasTransferParams: on every valid JSON object, the top-level scan
// agrees with encoding/json reading the first kv_transfer_params key, or a
// vllm_xargs object holding one (the router refuses repeated keys before,
// ambiguousKey); it never panics on anything.
func FuzzHasTransferParams(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","kv_transfer_params":{"do_remote_prefill":true}}`,
		`{"model":"m","kv_transfer_param\u0073":{}}`,
		`{"kv_transfer_params":null}`,
		`{"a":{"kv_transfer_params":1},"b":["kv_transfer_params"]}`,
		`{"s":"\"kv_transfer_params\":1","t":"\\"}`,
		` { "x" : [ 1 , { "y" : "z" } ] , "kv_transfer_params" : 0 } `,
		`{"k\u0076_transfer_params":"x"}`,
		`{"vllm_xargs":{"kv_transfer_params":"x"}}`,
		`{"vllm_xargs":{"kv_transfer_params":null},"kv_transfer_params":1}`,
		`{"vllm_xarg\u0073":{"a":1,"kv_transfer_param\u0073":[1]}}`,
		`{"vllm_xargs":"kv_transfer_params"}`,
		`{"kv_transfer_params":null,"vllm_xargs":{"kv_transfer_params":1}}`,
		`{"vllm_xargs":{"vllm_xargs":{"kv_transfer_params":true}}}`,
		`[1,2]`, `{`, `{"a":}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got := HasTransferParams(b)
		// A chat body's Parsed reads its decoded document instead; the
		// decoder keeps one only without repeated keys.
		if doc, err := tokenizer.DecodeDocument(b); err == nil && !doc.Duplicate {
			if fromDoc := (&Parsed{Body: b, doc: doc}).HasTransferParams(); fromDoc != got {
				t.Fatalf("%q: Parsed.HasTransferParams %v, HasTransferParams %v", b, fromDoc, got)
			}
		}
		if !json.Valid(b) {
			return
		}
		if want := transferParamsByDecoder(t, b); got != want {
			t.Fatalf("%q: HasTransferParams %v, encoding/json %v", b, got, want)
		}
	})
}

// transferParamsByDecoder is HasTransferParams's contract read with
// encoding/json's decoder: the first kv_transfer_params key of the object
// b decides, unless a vllm_xargs object before it holds one.
func transferParamsByDecoder(t *testing.T, b []byte) bool {
	dec := json.NewDecoder(bytes.NewReader(b))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return false
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			t.Fatalf("%q: %v", b, err)
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			t.Fatalf("%q: %v", b, err)
		}
		switch tok {
		case "kv_transfer_params":
			return !isNull(v)
		case "vllm_xargs":
			if transferParamsByDecoder(t, v) {
				return true
			}
		}
	}
	return false
}

// BenchmarkHasTransferParams: the top-level scan of a 64 KiB chat body
// whose text is escaped (\uXXXX, as Python's json.dumps sends non-ASCII),
// beside encoding/json reading the one field.
//
//	go test -run XXX -bench HasTransferParams -count 6 ./internal/request
func BenchmarkHasTransferParams(b *testing.B) {
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat(`\u4f60\u597d `, 64<<10/13) + `"}],"max_tokens":16}`)
	b.Run("scan", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		b.ReportAllocs()
		for b.Loop() {
			if HasTransferParams(body) {
				b.Fatal("found")
			}
		}
	})
	b.Run("encoding_json", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		b.ReportAllocs()
		for b.Loop() {
			var top struct {
				P json.RawMessage `json:"kv_transfer_params"`
			}
			if json.Unmarshal(body, &top) != nil || !isNull(top.P) {
				b.Fatal("found")
			}
		}
	})
}

// TestMayNameTransferParams holds the pre-check of HasTransferParams to
// its definition (the body holds "kv_transfer_params" or a \u escape) on
// the name at every place, cut short, next to lookalikes and overlapping
// them.
func TestMayNameTransferParams(t *testing.T) {
	for _, s := range []string{
		"", "kv_transfer_params", "_transfer_params", "v_transfer_params", "k_transfer_params",
		`{"kv_transfer_params":1}`, `{"x":"kv_transfer_param"}`, "xkv_transfer_paramsx",
		"__transfer_paramskv_transfer_params", "kv__transfer_params", "kkv_transfer_params",
		"kv_transfer_params_transfer_params", "_transfer_params_transfer_paramskv",
		`\u006bv_transfer_params`, `a\u`, `\\`, `a\nb`, "kv_transfer_p\u0061rams",
	} {
		want := strings.Contains(s, "kv_transfer_params") || strings.Contains(s, `\u`)
		if got := mayNameTransferParams([]byte(s)); got != want {
			t.Errorf("%q: %v, want %v", s, got, want)
		}
	}
}
