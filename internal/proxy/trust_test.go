package proxy

import (
	"bytes"
	"fmt"
	"log/slog"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// trustRouter records SetIndexTrusted calls.
type trustRouter struct {
	testRouter
	calls []string
}

func (r *trustRouter) SetIndexTrusted(replica string, ok bool) {
	r.calls = append(r.calls, fmt.Sprintf("%s=%v", replica, ok))
}

// TestTrustStreaks: misses (reported under half the prediction, by 16
// tokens or more) distrust an engine after 3 in a row; an agreeing answer
// breaks the streak; answers with nothing predicted count for nothing; 3
// agreeing answers in a row trust it again. Series go with the engine.
func TestTrustStreaks(t *testing.T) {
	present := true
	tr, err := newTrust(slog.New(slog.DiscardHandler), prometheus.NewRegistry(), func(string) bool { return present })
	if err != nil {
		t.Fatal(err)
	}
	r := &trustRouter{}
	tr.init("e0")
	steps := []struct {
		predicted, reported int
		calls               int // SetIndexTrusted calls so far
		distrusted          float64
	}{
		{368, 0, 0, 0},
		{368, 0, 0, 0},
		{368, 352, 0, 0}, // agrees: the streak is broken
		{368, 0, 0, 0},
		{0, 0, 0, 0},     // no prediction: no evidence
		{32, 20, 0, 0},   // short by 12 tokens: within the slack
		{368, 0, 0, 0},   // streak 1 again (32/20 agreed)
		{368, 100, 0, 0}, // 2
		{368, 183, 1, 1}, // 3: distrusted
		{368, 0, 1, 1},
		{368, 368, 1, 1},
		{368, 360, 1, 1},
		{368, 352, 2, 0}, // 3 agreeing: trusted again
	}
	for i, s := range steps {
		tr.observe(r, "m", "e0", s.predicted, s.reported)
		if len(r.calls) != s.calls || testutil.ToFloat64(tr.out.WithLabelValues("e0")) != s.distrusted {
			t.Fatalf("step %d (%d/%d): calls %v, distrusted %v; want %d calls, %v", i, s.predicted, s.reported,
				r.calls, testutil.ToFloat64(tr.out.WithLabelValues("e0")), s.calls, s.distrusted)
		}
	}
	if want := []string{"e0=false", "e0=true"}; fmt.Sprint(r.calls) != fmt.Sprint(want) {
		t.Fatalf("calls %v, want %v", r.calls, want)
	}
	if n := testutil.CollectAndCount(tr.errs); n != 1 {
		t.Fatalf("%d error histograms, want 1", n)
	}
	tr.forget("e0")
	present = false
	tr.observe(r, "m", "e0", 368, 0) // a request that ended after the removal
	if n := testutil.CollectAndCount(tr.errs) + testutil.CollectAndCount(tr.out) + testutil.CollectAndCount(tr.changes); n != 0 {
		t.Fatalf("%d series left after the engine was removed", n)
	}
}

// TestHitReport reads cached_tokens from a JSON answer and from a stream's
// usage event, and nothing from answers without prompt_tokens_details.
func TestHitReport(t *testing.T) {
	for _, tc := range []struct {
		name   string
		body   string
		sse    bool
		seen   bool
		cached int
	}{
		{"json", `{"id":"x","usage":{"prompt_tokens":400,"prompt_tokens_details":{"cached_tokens":352}}}`, false, true, 352},
		{"json without details", `{"usage":{"prompt_tokens":400}}`, false, false, 0},
		{"json null details", `{"usage":{"prompt_tokens":400,"prompt_tokens_details":null}}`, false, false, 0},
		{"stream", "data: {\"choices\":[]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"prompt_tokens_details\":{\"cached_tokens\":16}}}\n\ndata: [DONE]\n\n", true, true, 16},
		{"content naming the key", `{"choices":[{"text":"\"prompt_tokens_details\""}]}`, false, false, 0},
		{"truncated", `{"usage":{"prompt_tokens_details":{"cached_tokens":3`, false, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h hitReport
			h.note([]byte(tc.body), tc.sse)
			if h.seen != tc.seen || h.cached != tc.cached {
				t.Fatalf("seen %v cached %d, want %v %d", h.seen, h.cached, tc.seen, tc.cached)
			}
		})
	}
}

// FuzzHitReport: any answer bytes, JSON or event stream, are read without
// panic; bytes without "prompt_tokens_details" give no report, and reading
// the same bytes again gives the same one.
func FuzzHitReport(f *testing.F) {
	f.Add([]byte(`{"usage":{"prompt_tokens_details":{"cached_tokens":352}}}`), false)
	f.Add([]byte("data: {\"usage\":{\"prompt_tokens_details\":{\"cached_tokens\":16}}}\n\n"), true)
	f.Add([]byte(`"prompt_tokens_details"`), true)
	f.Fuzz(func(t *testing.T, b []byte, sse bool) {
		var h hitReport
		h.note(b, sse)
		if h.seen && !bytes.Contains(b, detailsKey) {
			t.Fatalf("report from %q without prompt_tokens_details", b)
		}
		h2 := h
		h2.note(b, sse)
		if h2 != h {
			t.Fatalf("second reading of %q: %+v, first %+v", b, h2, h)
		}
	})
}
