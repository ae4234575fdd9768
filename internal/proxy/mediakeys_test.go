package proxy

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"kvrouter/internal/group"
	"kvrouter/internal/kvindex"
)

// mmTok answers fixed ids and items; noMM hides TokensMM (a Tokenizer
// that cannot tell the items).
type mmTok struct {
	ids []uint32
	mm  []kvindex.MMItem
	err error
}

func (f mmTok) Tokens(ctx context.Context, chat bool, body []byte, text string) ([]uint32, error) {
	ids, _, err := f.TokensMM(ctx, chat, body, text)
	return ids, err
}

func (f mmTok) TokensMM(context.Context, bool, []byte, string) ([]uint32, []kvindex.MMItem, error) {
	return f.ids, f.mm, f.err
}

type noMM struct{ mmTok }

func (f noMM) Tokens(ctx context.Context, chat bool, body []byte, text string) ([]uint32, error) {
	return f.ids, f.err
}

// TestMediaRouteInput: an image chat's items from the render reach the
// router as extra keys; without items its tokens are withheld (keys
// without the items would match other images' blocks) and its length is
// the prefill cost; with no ids at all the images' estimated visual tokens
// are.
func TestMediaRouteInput(t *testing.T) {
	rg := newRig(t, 1)
	ids := make([]uint32, 60)
	items := []kvindex.MMItem{{Identifier: "abc", Offset: 5, Length: 40}}
	img := fmt.Sprintf(`{"type":"image_url","image_url":{"url":%q}}`, pngDataURL(t, 896, 896))
	imageChat := `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[` + img + `,{"type":"text","text":"what?"}]}]}`
	textChat := `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"text","text":"what?"}]}]}`
	for _, tc := range []struct {
		name   string
		tok    group.Tokenizer
		body   string
		tokens int // len(in.Tokens), -1 for nil
		mm     []kvindex.MMItem
		prompt int
	}{
		{"rendered with items", mmTok{ids: ids, mm: items}, imageChat, 60, items, 0},
		{"ids without items", mmTok{ids: ids}, imageChat, -1, nil, 60},
		{"a Tokenizer without TokensMM", noMM{mmTok{ids: ids}}, imageChat, -1, nil, 60},
		{"no ids: visual tokens", noMM{mmTok{err: errors.New("no render")}}, imageChat, -1, nil, 1024},
		{"text chat", mmTok{ids: ids}, textChat, 60, nil, 0},
		{"escaped keys are still media", mmTok{ids: ids}, strings.ReplaceAll(imageChat, `"type"`, `"\u0074ype"`), -1, nil, 60},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rg.srv.models["m"].Tok = tc.tok
			rg.router.mu.Lock()
			rg.router.inputs = nil
			rg.router.mu.Unlock()
			resp := rg.post("/v1/chat/completions", tc.body)
			if out := readAll(t, resp); resp.StatusCode != 200 {
				t.Fatalf("%d %s", resp.StatusCode, out)
			}
			rg.router.mu.Lock()
			in := rg.router.inputs[0]
			rg.router.mu.Unlock()
			n := len(in.Tokens)
			if in.Tokens == nil {
				n = -1
			}
			if n != tc.tokens || !reflect.DeepEqual(in.MM, tc.mm) || in.PromptTokens != tc.prompt {
				t.Fatalf("route input: %d tokens, mm %+v, prompt tokens %d; want %d, %+v, %d", n, in.MM, in.PromptTokens, tc.tokens, tc.mm, tc.prompt)
			}
		})
	}
}
