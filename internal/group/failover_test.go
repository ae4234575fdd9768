package group

import (
	"context"
	"errors"
	"net/url"
	"slices"
	"testing"
)

// fakeEngine is an engine whose health the test sets.
type fakeEngine struct {
	name string
	up   bool
}

func (e *fakeEngine) Name() string { return e.name }
func (e *fakeEngine) Up() bool     { return e.up }

// fixedTokens answers ids, or err.
type fixedTokens struct {
	ids []uint32
	err error
}

func (f *fixedTokens) Tokens(context.Context, bool, []byte, string) ([]uint32, error) {
	return f.ids, f.err
}

// TestFailoverOrder: a down engine is skipped, a connection error fails
// over to the next up engine, an engine's own error is final, and with no
// engine answering the error wraps ErrNoTokenizerEngine; an engine added
// later is tried, a removed one no longer.
func TestFailoverOrder(t *testing.T) {
	refused := &url.Error{Op: "Post", URL: "http://127.0.0.1:1/tokenize", Err: errors.New("connect: connection refused")}
	e0, e1, e2 := &fakeEngine{"e0", false}, &fakeEngine{"e1", true}, &fakeEngine{"e2", true}
	t0, t1, t2 := &fixedTokens{ids: []uint32{0}}, &fixedTokens{err: refused}, &fixedTokens{ids: []uint32{2, 2}}
	f, err := NewFailoverTokenizer("m", []EngineTokenizer{{Endpoint: e0, Tok: t0}, {Endpoint: e1, Tok: t1}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := f.Tokens(ctx, false, nil, "x"); !errors.Is(err, ErrNoTokenizerEngine) {
		t.Fatalf("e0 down, e1 refusing: err %v, want ErrNoTokenizerEngine", err)
	}
	if err := f.Add(EngineTokenizer{Endpoint: e2, Tok: t2}); err != nil {
		t.Fatal(err)
	}
	if ids, err := f.Tokens(ctx, false, nil, "x"); err != nil || !slices.Equal(ids, t2.ids) {
		t.Fatalf("after Add: %v %v, want e2's ids", ids, err)
	}
	t1.err = errors.New("engine /tokenize: HTTP 400")
	if _, err := f.Tokens(ctx, false, nil, "x"); err == nil || errors.Is(err, ErrNoTokenizerEngine) {
		t.Fatalf("engine's own error: %v, want it final", err)
	}
	f.Remove("e1")
	if ids, err := f.Tokens(ctx, false, nil, "x"); err != nil || !slices.Equal(ids, t2.ids) {
		t.Fatalf("after Remove: %v %v, want e2's ids", ids, err)
	}
	if _, err := NewFailoverTokenizer("m", []EngineTokenizer{{Endpoint: e0}}, nil); err == nil {
		t.Fatal("an engine without a tokenizer accepted")
	}
}
