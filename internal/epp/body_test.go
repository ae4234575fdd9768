package epp

import (
	"bytes"
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"kvrouter/internal/bodybudget"
)

// FuzzAssemble: any body cut into any chunks assembles to itself when it
// fits the limit, and to errBodyTooLarge (holding nothing) when it does
// not; nothing is accepted after the end; the chunks sent back rejoin to
// the body, none over chunkSize.
func FuzzAssemble(f *testing.F) {
	f.Add([]byte(`{"model":"m","prompt":"hi"}`), []byte{3, 7, 1}, int64(1<<20))
	f.Add([]byte(`{"model":"m"}`), []byte{}, int64(4))
	f.Add(bytes.Repeat([]byte("x"), 200000), []byte{255, 0, 9}, int64(300000))
	f.Fuzz(func(t *testing.T, body, cuts []byte, limit int64) {
		if limit < 0 {
			limit = -limit
		}
		a := assembler{limit: limit}
		rest := body
		var err error
		for i := 0; len(rest) > 0 || i == 0; i++ {
			n := len(rest)
			if i < len(cuts) {
				n = min(n, int(cuts[i])*97)
			}
			end := n == len(rest)
			if err = a.add(rest[:n], end); err != nil {
				break
			}
			rest = rest[n:]
			if end {
				break
			}
		}
		switch {
		case int64(len(body)) > limit:
			if !errors.Is(err, errBodyTooLarge) || a.buf != nil {
				t.Fatalf("%d bytes over limit %d: err %v, holds %d", len(body), limit, err, len(a.buf))
			}
		case err != nil:
			t.Fatalf("%d bytes within %d: %v", len(body), limit, err)
		case !bytes.Equal(a.buf, body):
			t.Fatalf("assembled %d bytes, sent %d", len(a.buf), len(body))
		}
		if err := a.add([]byte("x"), true); !errors.Is(err, errBodyAfterEnd) {
			t.Fatalf("chunk after the end: %v", err)
		}
		var joined []byte
		for _, c := range chunks(body) {
			if len(c) > chunkSize {
				t.Fatalf("chunk of %d bytes", len(c))
			}
			joined = append(joined, c...)
		}
		if !bytes.Equal(joined, body) {
			t.Fatal("chunks do not rejoin to the body")
		}
	})
}

func TestAssemblerTrailers(t *testing.T) {
	a := assembler{limit: 10}
	if err := a.add([]byte("abc"), false); err != nil {
		t.Fatal(err)
	}
	if b, ok := a.finish(); !ok || string(b) != "abc" {
		t.Fatalf("finish: %q %v", b, ok)
	}
	if _, ok := a.finish(); ok {
		t.Fatal("finished twice")
	}
}

func TestTracker(t *testing.T) {
	for _, c := range []struct {
		name    string
		sse     bool
		chunks  []string
		prompt  int
		cached  int
		errored bool
	}{
		{"json", false, []string{`{"id":"x","usage":{"prompt_tokens":`, `12,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":8}}}`}, 12, 8, false},
		{"json error", false, []string{`{"error":{"message":"no","type":"BadRequestError","code":400}}`}, 0, 0, true},
		{"sse split usage", true, []string{"data: {\"choices\":[]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt", "_tokens\":5,\"completion_tokens\":2}}\n\ndata: [DONE]\n\n"}, 5, -1, false},
		{"sse error event", true, []string{"data: {\"choices\":[]}\n\n", "data: {\"error\":{\"message\":\"boom\"}}\n\ndata: [DONE]\n\n"}, 0, 0, true},
		{"sse crlf", true, []string{"data: {\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":1}}\r\n\r\n"}, 7, -1, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			tr := tracker{sse: c.sse}
			for _, ch := range c.chunks {
				tr.feed([]byte(ch))
			}
			tr.end()
			if tr.errored != c.errored {
				t.Errorf("errored %v", tr.errored)
			}
			if c.prompt == 0 {
				return
			}
			if tr.usage == nil || tr.usage.PromptTokens != c.prompt {
				t.Fatalf("usage %+v", tr.usage)
			}
			if c.cached >= 0 && (tr.usage.PromptTokensDetails == nil || tr.usage.PromptTokensDetails.CachedTokens != c.cached) {
				t.Errorf("cached %+v", tr.usage.PromptTokensDetails)
			}
		})
	}
}

// TestTrackerBounded: a line or body over maxTracked is not held whole.
func TestTrackerBounded(t *testing.T) {
	tr := tracker{sse: true}
	big := bytes.Repeat([]byte("a"), maxTracked/4)
	tr.feed([]byte("data: "))
	for range 8 {
		tr.feed(big)
	}
	if len(tr.buf) > maxTracked {
		t.Fatalf("holds %d bytes", len(tr.buf))
	}
	tr.feed([]byte("\ndata: {\"usage\":{\"prompt_tokens\":3}}\n"))
	if tr.usage == nil || tr.usage.PromptTokens != 3 {
		t.Fatalf("after an over-long line: %+v", tr.usage)
	}
	j := tracker{}
	for range 8 {
		j.feed(big)
	}
	if len(j.buf) > maxTracked {
		t.Fatalf("json holds %d bytes", len(j.buf))
	}
}

// TestAssemblerBudget: streams share one budget; a chunk past it is
// refused and drops what its stream held, and release gives every byte
// back.
func TestAssemblerBudget(t *testing.T) {
	b := bodybudget.New(100)
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "held"})
	a1 := assembler{limit: 1000, budget: b, gauge: g}
	a2 := assembler{limit: 1000, budget: b, gauge: g}
	if err := a1.add(make([]byte, 60), false); err != nil {
		t.Fatal(err)
	}
	if err := a2.add(make([]byte, 30), false); err != nil {
		t.Fatal(err)
	}
	if err := a2.add(make([]byte, 20), false); !errors.Is(err, errBodyBudget) || a2.buf != nil {
		t.Fatalf("past the budget: err %v, holds %d bytes", err, len(a2.buf))
	}
	if u, h := b.Held(), testutil.ToFloat64(g); u != 60 || h != 60 {
		t.Fatalf("budget holds %d (gauge %v) after the refusal, want 60 (a1's)", u, h)
	}
	a2.release() // as the stream's end does: nothing left to give
	a1.release()
	a1.release()
	if u, h := b.Held(), testutil.ToFloat64(g); u != 0 || h != 0 {
		t.Fatalf("budget holds %d (gauge %v) after both released, want 0", u, h)
	}
	a3 := assembler{limit: 1000, budget: b}
	if err := a3.add(make([]byte, 100), true); err != nil {
		t.Fatalf("a body of the whole budget once it is free: %v", err)
	}
	a4 := assembler{limit: 50, budget: b}
	if err := a4.add(make([]byte, 10), false); !errors.Is(err, errBodyBudget) {
		t.Fatalf("with the budget spent: %v", err)
	}
	a3.release()
	if err := a4.add(make([]byte, 60), true); !errors.Is(err, errBodyAfterEnd) {
		t.Fatalf("a refused stream takes no more chunks: %v", err)
	}
	if u := b.Held(); u != 0 {
		t.Fatalf("budget holds %d at the end, want 0", u)
	}
}
