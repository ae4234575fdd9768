package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"net/url"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"kvrouter/internal/fleet"
	"kvrouter/internal/group"
)

// fakeTokens answers ids, or err, and counts its calls.
type fakeTokens struct {
	ids   []uint32
	err   atomic.Pointer[error]
	calls atomic.Int32
}

func (f *fakeTokens) Tokens(ctx context.Context, chat bool, body []byte, text string) ([]uint32, error) {
	f.calls.Add(1)
	if p := f.err.Load(); p != nil {
		return nil, *p
	}
	return f.ids, nil
}

func (f *fakeTokens) fail(err error) { f.err.Store(&err) }

var errRefused = &url.Error{Op: "Post", URL: "http://127.0.0.1:1/tokenize", Err: errors.New("connect: connection refused")}

// TestFailoverTokenizer: the first up engine tokenizes; a connection error
// fails over to the next; an ejected engine is skipped; an engine's own
// error answer is final; with no engine able to tokenize, the request is
// routed by load and kvrouter_proxy_tokenizer_unavailable_total counts it;
// then tokenization recovers.
func TestFailoverTokenizer(t *testing.T) {
	rg := newRig(t, 2)
	t0, t1 := &fakeTokens{ids: []uint32{1, 2, 3}}, &fakeTokens{ids: []uint32{4, 5, 6, 7}}
	ft, err := group.NewFailoverTokenizer("m", []group.EngineTokenizer{{Endpoint: rg.fleet.Endpoint("e0"), Tok: t0}, {Endpoint: rg.fleet.Endpoint("e1"), Tok: t1}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	rg.srv.models["m"].Tok = ft
	route := func() (bool, int) {
		t.Helper()
		var d struct {
			Tokenized    bool `json:"tokenized"`
			PromptTokens int  `json:"prompt_tokens"`
		}
		out := readAll(t, rg.post("/v1/route", chatBody))
		if err := json.Unmarshal([]byte(out), &d); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		return d.Tokenized, d.PromptTokens
	}
	unavailable := func() float64 { return testutil.ToFloat64(rg.srv.m.tokenizeNoEngine.WithLabelValues("m")) }

	if tok, n := route(); !tok || n != 3 || t1.calls.Load() != 0 {
		t.Fatalf("both up: tokenized %v, %d tokens, second engine asked %d times", tok, n, t1.calls.Load())
	}
	t0.fail(errRefused)
	if tok, n := route(); !tok || n != 4 {
		t.Fatalf("first refuses: tokenized %v, %d tokens", tok, n)
	}
	rg.fleet.Report(rg.fleet.Endpoint("e0"), fleet.OutcomeConnError)
	c0 := t0.calls.Load()
	if tok, n := route(); !tok || n != 4 || t0.calls.Load() != c0 {
		t.Fatalf("first ejected: tokenized %v, %d tokens, ejected engine asked %d times", tok, n, t0.calls.Load()-c0)
	}
	if unavailable() != 0 {
		t.Errorf("unavailable counted with an engine up")
	}
	// An engine's answer (not a connection error) is final: no failover.
	t1.fail(errors.New("engine /tokenize: HTTP 400"))
	if tok, _ := route(); tok || unavailable() != 0 {
		t.Errorf("engine error: tokenized %v, unavailable %v", tok, unavailable())
	}
	t1.fail(errRefused)
	if tok, _ := route(); tok || unavailable() != 1 {
		t.Errorf("no engine: tokenized %v, unavailable %v", tok, unavailable())
	}
	t1.err.Store(nil)
	if tok, n := route(); !tok || n != 4 {
		t.Errorf("recovered: tokenized %v, %d tokens", tok, n)
	}
	// No engine up at all: the first is tried anyway (a local tokenizer
	// needs no engine).
	rg.fleet.Report(rg.fleet.Endpoint("e1"), fleet.OutcomeConnError)
	t0.err.Store(nil)
	if ids, err := ft.Tokens(context.Background(), true, []byte(chatBody), ""); err != nil || len(ids) != 3 {
		t.Errorf("all ejected, first works: %v %v", ids, err)
	}
}
