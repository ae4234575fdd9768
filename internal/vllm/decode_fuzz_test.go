package vllm

import (
	"bytes"
	"errors"
	"testing"
)

// FuzzDecodeBatch checks DecodeBatch's contract on arbitrary input: it never
// panics; a failure is a *DecodeError wrapping ErrMalformed; a success
// round-trips through AppendBatch in both layouts (re-encoding the decoded
// batch decodes to a batch with identical encoding). Seeds: every golden
// payload of testdata/vllm/events.json plus testdata/fuzz/FuzzDecodeBatch.
//
//	go test -run '^$' -fuzz FuzzDecodeBatch -fuzztime 10s ./internal/vllm/
func FuzzDecodeBatch(f *testing.F) {
	for _, c := range loadEventCases(f) {
		f.Add(c.payload(f))
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		b, err := DecodeBatch(payload)
		if err != nil {
			var de *DecodeError
			if !errors.Is(err, ErrMalformed) || !errors.As(err, &de) {
				t.Fatalf("error %v is not a *DecodeError wrapping ErrMalformed", err)
			}
			if de.Offset < 0 || de.Offset > len(payload) || de.Field == "" {
				t.Fatalf("bad location in %v", err)
			}
			return
		}
		for _, l := range []Layout{LayoutMap, LayoutArray} {
			enc, err := AppendBatch(nil, &b, l)
			if err != nil {
				if l == LayoutArray {
					continue // locality cannot be written as an array
				}
				t.Fatalf("AppendBatch(%v) of a decoded batch: %v", l, err)
			}
			b2, err := DecodeBatch(enc)
			if err != nil {
				t.Fatalf("decode of re-encoded %v batch %x: %v", l, enc, err)
			}
			enc2, err := AppendBatch(nil, &b2, l)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(enc, enc2) {
				t.Fatalf("%v round trip differs:\n%x\n%x", l, enc, enc2)
			}
			if len(b2.Events) != len(b.Events) || b2.DataParallelRank != b.DataParallelRank {
				t.Fatalf("%v round trip changed the batch shape", l)
			}
		}
	})
}
