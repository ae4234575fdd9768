package enginesim

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"image"
	"image/color"
	"image/png"
	"strings"
	"testing"
)

// pngBytes is a w x h PNG whose pixels depend on shade.
func pngBytes(t *testing.T, w, h int, shade uint8) []byte {
	t.Helper()
	img := image.NewGray(image.Rect(0, 0, w, h))
	img.Set(0, 0, color.Gray{Y: shade})
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func imageChat(question string, img []byte) map[string]any {
	url := "data:image/png;base64," + base64.StdEncoding.EncodeToString(img)
	return map[string]any{"model": "m", "max_tokens": 1, "messages": []any{
		map[string]any{"role": "user", "content": []any{
			map[string]any{"type": "text", "text": "Look:"},
			map[string]any{"type": "image_url", "image_url": map[string]any{"url": url}},
			map[string]any{"type": "text", "text": question},
		}},
	}}
}

// TestImageChat: an image part renders to its Qwen2.5-VL placeholder count
// (280x280 -> 100) of one id at its place in the chat; the render endpoint
// answers vLLM's features (hash = SHA-256 of the image bytes, placeholder
// range); a repeat is cached up to its last full block, the same question
// with another image of equal size only up to the blocks before the image;
// an http image URL is a 400.
func TestImageChat(t *testing.T) {
	s := startServer(t, Config{ServedModelName: "m"})
	a, b := pngBytes(t, 280, 280, 1), pngBytes(t, 280, 280, 2)
	q := strings.Repeat("what is in the picture? ", 4)
	resp, body := post(t, s.url+"/v1/chat/completions/render", imageChat(q, a))
	if resp.StatusCode != 200 {
		t.Fatalf("render: %d %s", resp.StatusCode, body)
	}
	var r struct {
		TokenIDs []uint32 `json:"token_ids"`
		Features struct {
			MMHashes       map[string][]string `json:"mm_hashes"`
			MMPlaceholders map[string][]struct {
				Offset, Length int
			} `json:"mm_placeholders"`
		} `json:"features"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		t.Fatal(err)
	}
	prefix := "<|user|>\nLook:\n" // ByteTokenizer: one id per byte
	sum := sha256.Sum256(a)
	ph := r.Features.MMPlaceholders["image"]
	if hs := r.Features.MMHashes["image"]; len(hs) != 1 || hs[0] != hex.EncodeToString(sum[:]) || len(ph) != 1 || ph[0].Offset != len(prefix) || ph[0].Length != 100 {
		t.Fatalf("features %s", body)
	}
	pad := uint32(DefaultVocabSize - 1)
	for i := range 100 {
		if r.TokenIDs[len(prefix)+i] != pad {
			t.Fatalf("token %d = %d, want the placeholder %d", len(prefix)+i, r.TokenIDs[len(prefix)+i], pad)
		}
	}
	if want := len(prefix) + 100 + len("\n"+q+"\n<|assistant|>\n"); len(r.TokenIDs) != want {
		t.Fatalf("%d ids, want %d", len(r.TokenIDs), want)
	}
	n := len(r.TokenIDs)
	cached := func(body map[string]any) int {
		t.Helper()
		resp, out := post(t, s.url+"/v1/chat/completions", body)
		if resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, out)
		}
		var c completionOut
		if err := json.Unmarshal(out, &c); err != nil {
			t.Fatal(err)
		}
		if c.Usage.PromptTokens != n {
			t.Fatalf("prompt tokens %d, want %d", c.Usage.PromptTokens, n)
		}
		return c.Usage.PromptTokensDetails.CachedTokens
	}
	bs := s.coreCfg.BlockSize
	if c := cached(imageChat(q, a)); c != 0 {
		t.Fatalf("first: cached %d", c)
	}
	if c, want := cached(imageChat(q, a)), (n-1)/bs*bs; c != want {
		t.Fatalf("repeat: cached %d, want %d", c, want)
	}
	if c, want := cached(imageChat(q, b)), len(prefix)/bs*bs; c != want {
		t.Fatalf("other image: cached %d, want %d (the blocks before the image)", c, want)
	}
	http := imageChat(q, a)
	http["messages"].([]any)[0].(map[string]any)["content"].([]any)[1] = map[string]any{"type": "image_url", "image_url": map[string]any{"url": "https://example.com/x.png"}}
	if resp, out := post(t, s.url+"/v1/chat/completions", http); resp.StatusCode != 400 || !strings.Contains(string(out), "data:image") {
		t.Fatalf("http image: %d %s", resp.StatusCode, out)
	}
	// The prompt's own text may not hold the placeholder text.
	if resp, out := post(t, s.url+"/v1/chat/completions", imageChat(imagePadText, a)); resp.StatusCode != 400 {
		t.Fatalf("placeholder text in the prompt: %d %s", resp.StatusCode, out)
	}
}

// FuzzChatImages: any chat body is refused or rewritten into one whose
// image parts are gone; never a panic.
func FuzzChatImages(f *testing.F) {
	img := "data:image/png;base64," + base64.StdEncoding.EncodeToString(pngBytesF(56, 56))
	f.Add([]byte(`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"` + img + `"}},{"type":"text","text":"q"}]}]}`))
	f.Add([]byte(`{"messages":[{"role":"user","content":"image"}]}`))
	f.Add([]byte(`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		out, imgs, err := chatImages(body)
		if err != nil {
			return
		}
		if _, again, err := chatImages(out); err != nil || len(again) != 0 {
			t.Fatalf("rewritten body %s still has %d images (%v)", out, len(again), err)
		}
		for _, im := range imgs {
			if im.tokens < 1 || len(im.id) != 64 {
				t.Fatalf("image %+v", im)
			}
		}
	})
}

func pngBytesF(w, h int) []byte {
	var b bytes.Buffer
	_ = png.Encode(&b, image.NewGray(image.Rect(0, 0, w, h)))
	return b.Bytes()
}

// TestChatImagesEscapedType: an image part whose type is spelt with JSON
// escapes is still an image.
func TestChatImagesEscapedType(t *testing.T) {
	url := "data:image/png;base64," + base64.StdEncoding.EncodeToString(pngBytesF(56, 56))
	body := []byte(`{"messages":[{"role":"user","content":[{"type":"\u0069mage_url","\u0069mage_url":{"url":"` + url + `"}}]}]}`)
	body = bytes.ReplaceAll(body, []byte("image/png"), []byte(`\u0069mage/png`))
	if _, imgs, err := chatImages(body); err != nil || len(imgs) != 1 || imgs[0].tokens != 4 {
		t.Fatalf("images %+v, err %v; want one of 4 tokens", imgs, err)
	}
}
