package e2e

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// e2ePNG is a w x h PNG data URL whose bytes depend on shade.
func e2ePNG(t *testing.T, w, h int, shade uint8) string {
	t.Helper()
	img := image.NewGray(image.Rect(0, 0, w, h))
	img.Set(0, 0, color.Gray{Y: shade})
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		t.Fatal(err)
	}
	return "data:image/png;base64," + base64.StdEncoding.EncodeToString(b.Bytes())
}

func e2eImageChat(url, question string) string {
	b, _ := json.Marshal(map[string]any{"model": "m", "max_tokens": 2, "messages": []any{
		map[string]any{"role": "system", "content": strings.Repeat("You describe pictures. ", 8)},
		map[string]any{"role": "user", "content": []any{
			map[string]any{"type": "image_url", "image_url": map[string]any{"url": url}},
			map[string]any{"type": "text", "text": question},
		}},
	}})
	return string(b)
}

// TestE2EImages: two engine-sim processes behind kvrouter with
// tokenizer: render. An image-and-question chat is rendered by the
// engine (placeholders and the image's hash and range), keyed with vLLM's
// multimodal extra keys, and its blocks, stored on the engine and
// published in BlockStored events with extra_keys, match the request's
// keys: the repeat lands on the engine holding it with the predicted
// cached tokens equal to the engine's. The same question with another
// image of the same size matches only the text before the image (the
// placeholder ids are equal, the identifiers are not). An image over the
// route's visual-token budget is refused with OpenAI's 400.
func TestE2EImages(t *testing.T) {
	e2eLeakCheck(t)
	bin := e2eBuild(t)
	a := startE2ESimProcessArgs(t, bin, 1)
	b := startE2ESimProcessArgs(t, bin, 1)
	yaml := fmt.Sprintf(`health: {probe_interval: 200ms, scrape_interval: 200ms}
models:
  - name: m
    tokenizer: render
    media: {max_items: {image: 2}, max_visual_tokens: 1100}
    engines:
      - {name: e0, url: %q, events: %q, replay: %q}
      - {name: e1, url: %q, events: %q, replay: %q}
`, a.url, a.events, a.replay, b.url, b.events, b.replay)
	r := serveYAML(t, yaml, 0)
	t.Cleanup(a.stop)
	t.Cleanup(b.stop)
	r.waitFullyReady(t)

	img1, img2 := e2ePNG(t, 448, 448, 1), e2ePNG(t, 448, 448, 2) // 256 visual tokens each
	q := "What is in this picture, and what colour is its top left corner?"
	first := e2eImageChat(img1, q)
	// Sent to e1 directly: the router learns its blocks from e1's
	// BlockStored events alone (their extra_keys), not from a prediction.
	hresp, err := http.Post(b.url+"/v1/chat/completions", "application/json", strings.NewReader(first))
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(hresp.Body)
	hresp.Body.Close()
	var usage struct {
		Usage struct {
			Prompt int `json:"prompt_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(raw, &usage); err != nil || hresp.StatusCode != 200 || usage.Usage.Prompt < 256 {
		t.Fatalf("direct: %d, %d prompt tokens (%v): the placeholders are prompt tokens", hresp.StatusCode, usage.Usage.Prompt, err)
	}
	n := usage.Usage.Prompt
	const bs = 16 // engine-sim's default block size
	full := (n - 1) / bs * bs
	e2eEventually(t, 10*time.Second, "e1's image blocks indexed from its events", func() bool {
		resp, _ := r.post("/v1/route", first)
		return resp.Header.Get("X-Kvrouter-Replica") == "e1" && resp.Header.Get("X-Kvrouter-Cached-Tokens") == fmt.Sprint(n/bs*bs)
	})
	for i := range 3 {
		resp, out := r.post("/v1/chat/completions", first)
		if resp.StatusCode != 200 || resp.Header.Get("X-Kvrouter-Replica") != "e1" {
			t.Fatalf("repeat %d: %d on %q, want e1: %s", i, resp.StatusCode, resp.Header.Get("X-Kvrouter-Replica"), out)
		}
		if p, got := resp.Header.Get("X-Kvrouter-Cached-Tokens"), e2eCachedTokens(t, out); p != fmt.Sprint(got) || got != full {
			t.Fatalf("repeat %d: predicted %s, engine %d, want %d both", i, p, got, full)
		}
	}

	// Another image, same size, same question: only the system prompt's
	// blocks before the image match, on the holder as on the other.
	other := e2eImageChat(img2, q)
	resp, _ := r.post("/v1/route", other)
	pred := resp.Header.Get("X-Kvrouter-Cached-Tokens")
	sys := len("<|system|>\n"+strings.Repeat("You describe pictures. ", 8)+"\n<|user|>\n") / bs * bs
	if pred != fmt.Sprint(sys) {
		t.Fatalf("other image: predicted %s, want %d (the blocks before the image)", pred, sys)
	}
	resp, out := r.post("/v1/chat/completions", other)
	if resp.StatusCode != 200 {
		t.Fatalf("other image: %d %s", resp.StatusCode, out)
	}
	if p, got := resp.Header.Get("X-Kvrouter-Cached-Tokens"), e2eCachedTokens(t, out); p != fmt.Sprint(got) {
		t.Fatalf("other image: predicted %s, engine %d", p, got)
	}
	t.Logf("%d-token prompt (256 placeholders): repeats cached %d (predicted = engine); other image %d", n, full, sys)

	// 896x896 is 1,024 visual tokens; two of them exceed the budget.
	big := e2ePNG(t, 896, 896, 3)
	body, _ := json.Marshal(map[string]any{"model": "m", "messages": []any{map[string]any{"role": "user", "content": []any{
		map[string]any{"type": "image_url", "image_url": map[string]any{"url": big}},
		map[string]any{"type": "image_url", "image_url": map[string]any{"url": big}},
	}}}})
	resp, out = r.post("/v1/chat/completions", string(body))
	if resp.StatusCode != 400 || !strings.Contains(out, `"type":"invalid_request_error"`) || !strings.Contains(out, "2048 visual tokens") || !strings.Contains(out, `"param":"messages"`) {
		t.Fatalf("over budget: %d %s", resp.StatusCode, out)
	}
}
