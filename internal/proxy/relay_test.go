package proxy

import (
	"bytes"
	"testing"
)

// lastEventEndRef is the definition of lastEventEnd: the end of the last
// "\n\n" or "\r\n\r\n", whichever ends later.
func lastEventEndRef(b []byte) int {
	i := bytes.LastIndex(b, []byte("\n\n"))
	j := bytes.LastIndex(b, []byte("\r\n\r\n"))
	if j >= 0 && j+4 > i+2 {
		return j + 4
	}
	if i >= 0 {
		return i + 2
	}
	return 0
}

func TestLastEventEnd(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int
	}{
		{"", 0},
		{"\n", 0},
		{"\n\n", 2},
		{"data: x\n", 0},
		{"data: x\n\n", 9},
		{"data: x\n\ndata: y\n", 9},
		{"data: x\n\ndata: y\n\n", 18},
		{"data: x\r\n\r\n", 11},
		{"data: x\r\n\r\ndata: y\r\n", 11},
		{"data: x\r\n\n", 10},
		{"data: x\n\r\n", 0},
		{"a\nb\nc\n", 0},
		{"a\n\nb\nc\nd", 3},
		{"\r\n\r", 0},
	} {
		if got := lastEventEnd([]byte(tc.in)); got != tc.want {
			t.Errorf("lastEventEnd(%q) = %d, want %d", tc.in, got, tc.want)
		}
		if ref := lastEventEndRef([]byte(tc.in)); ref != tc.want {
			t.Errorf("reference(%q) = %d, want %d", tc.in, ref, tc.want)
		}
	}
}

// FuzzLastEventEnd checks the newline walk against the definition on
// arbitrary engine bytes.
func FuzzLastEventEnd(f *testing.F) {
	f.Add([]byte(benchChunk))
	f.Add([]byte("data: {\"a\":1}\r\n\r\ndata: [DONE]\r\n"))
	f.Add([]byte(": ping\n\nevent: x\ndata: y\n\n\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if got, want := lastEventEnd(b), lastEventEndRef(b); got != want {
			t.Fatalf("lastEventEnd(%q) = %d, want %d", b, got, want)
		}
	})
}
