package proxy

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"image"
	"image/png"
	"strings"
	"testing"

	"kvrouter/internal/config"
	"kvrouter/internal/fleet"
)

func TestQwen2VLImageTokens(t *testing.T) {
	for _, c := range []struct{ w, h, want int }{
		{896, 896, 1024}, // the figure: 32 x 32 cells of 28 pixels
		{1000, 500, 648}, // rounded to 1008 x 504: 36 x 18
		{28, 28, 4},      // below min_pixels 3136: scaled up to 56 x 56
		{0, 10, 0},
	} {
		if got := Qwen2VLImageTokens(c.w, c.h); got != c.want {
			t.Errorf("%dx%d: %d tokens, want %d", c.w, c.h, got, c.want)
		}
	}
	// Above max_pixels the image is scaled down: never more than
	// 12845056 / 784 = 16384 tokens.
	for _, s := range []int{8000, 10000, 30000} {
		if got := Qwen2VLImageTokens(s, s/2); got > 16384 || got < 16384*9/10 {
			t.Errorf("%dx%d: %d tokens, want just under 16384", s, s/2, got)
		}
	}
}

func pngDataURL(t *testing.T, w, h int) string {
	t.Helper()
	var b bytes.Buffer
	if err := png.Encode(&b, image.NewGray(image.Rect(0, 0, w, h))); err != nil {
		t.Fatal(err)
	}
	return "data:image/png;base64," + base64.StdEncoding.EncodeToString(b.Bytes())
}

// TestMediaLimits: items per modality, the pixel budget and the visual-token
// budget are enforced before forwarding with OpenAI-shaped 400s; an alias
// has its own limits; an http image counts as an item only.
func TestMediaLimits(t *testing.T) {
	rg := newRig(t, 1, func(c *config.Config, _ *fleet.Config) {
		c.Models[0].Media = &config.MediaLimits{MaxItems: map[string]int{"image": 2, "video": 0}, MaxPixels: 2_000_000, MaxVisualTokens: 1500}
		c.Models[0].Aliases = []config.Alias{{Name: "m-small", Media: &config.MediaLimits{MaxVisualTokens: 1000}}}
	})
	big := pngDataURL(t, 896, 896) // 802,816 pixels, 1,024 tokens
	chat := func(model string, parts ...string) string {
		return fmt.Sprintf(`{"model":%q,"max_tokens":1,"messages":[{"role":"user","content":[{"type":"text","text":"what is it?"}%s]}]}`, model, strings.Join(parts, ""))
	}
	img := func(u string) string { return fmt.Sprintf(`,{"type":"image_url","image_url":{"url":%q}}`, u) }
	tests := []struct {
		name, body string
		status     int
		msg        string
	}{
		{"one image", chat("m", img(big)), 200, ""},
		{"three images", chat("m", img("https://x/a.png"), img("https://x/b.png"), img("https://x/c.png")), 400, "at most 2 image item(s)"},
		{"a video", chat("m", `,{"type":"video_url","video_url":{"url":"https://x/v.mp4"}}`), 400, "at most 0 video"},
		{"two big images: tokens", chat("m", img(big), img(big)), 400, "about 2048 visual tokens"},
		{"alias: its own budget", chat("m-small", img(big)), 400, "at most 1000"},
		{"pixels", chat("m", img(pngDataURL(t, 2000, 1100))), 400, "2200000 pixels"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := rg.engines[0].requests.Load()
			resp := rg.post("/v1/chat/completions", tt.body)
			out := readAll(t, resp)
			if resp.StatusCode != tt.status || !strings.Contains(out, tt.msg) {
				t.Fatalf("%d %s, want %d with %q", resp.StatusCode, out, tt.status, tt.msg)
			}
			if tt.status == 400 {
				if e := errorOf(t, out); e.Type != typeInvalidRequest || e.Param == nil || *e.Param != "messages" {
					t.Errorf("error %+v", e)
				}
				if rg.engines[0].requests.Load() != before {
					t.Error("a refused request reached the engine")
				}
			}
		})
	}
}
