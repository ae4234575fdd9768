package proxy

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"image"
	_ "image/gif" // image.DecodeConfig of data URLs
	_ "image/jpeg"
	_ "image/png"
	"net/http"
	"strings"

	"kvrouter/internal/config"
	"kvrouter/internal/vllm"
)

// Media limits: a model group's (or route alias's) bounds on the images,
// audio and video of one chat request, checked before forwarding and
// answered with OpenAI-shaped 400s (param "messages"). vLLM enforces the
// item counts itself with --limit-mm-per-prompt '{"image": 2, "video": 0}'
// (vllm/config/multimodal.py limit_per_prompt); checking them here spares
// the engine a request it refuses, and the pixel and visual-token budgets
// bound what one prompt may cost.
//
// Pixel sizes are known only for images inlined as data: URLs (PNG, JPEG,
// GIF headers); an image given by http(s) URL counts as an item but not
// towards the pixel and token budgets.

// Qwen2VLImageTokens estimates the visual tokens of a w x h image under
// Qwen2.5-VL's resizing (896x896 -> 1,024; 0 for an empty image): see
// vllm.Qwen2VLImageTokens. It is an estimate for routing and limits: other
// models count differently.
func Qwen2VLImageTokens(w, h int) int { return vllm.Qwen2VLImageTokens(w, h) }

// mediaModality maps a chat content part's type to its modality ("" for
// text and unknown types), as vLLM's chat parser names them
// (vllm/entrypoints/chat_utils.py).
func mediaModality(typ string) string {
	switch typ {
	case "image_url", "image_embeds", "image_pil", "input_image", "image":
		return "image"
	case "audio_url", "input_audio", "audio":
		return "audio"
	case "video_url", "video":
		return "video"
	}
	return ""
}

// mediaLimits returns the limits for x: its alias's when set, else its
// group's (nil: none).
func mediaLimits(x *exchange) *config.MediaLimits {
	if x.route != nil && x.route.Media != nil {
		return x.route.Media
	}
	return x.m.cfg.Media
}

// checkMedia applies x's media limits to its chat messages (x.media).
func checkMedia(x *exchange) *apiError {
	lim := mediaLimits(x)
	if lim == nil || x.req.kind != kindChat {
		return nil
	}
	counts, pixels, tokens := x.media.counts, x.media.pixels, x.media.visualTokens
	for mod, n := range counts {
		if most, ok := lim.MaxItems[mod]; ok && n > most {
			return mediaError(fmt.Sprintf("at most %d %s item(s) may be given in one prompt for model %q; the request has %d", most, mod, x.asked, n))
		}
	}
	if lim.MaxPixels > 0 && pixels > lim.MaxPixels {
		return mediaError(fmt.Sprintf("the request's images have %d pixels; model %q allows at most %d per prompt", pixels, x.asked, lim.MaxPixels))
	}
	if lim.MaxVisualTokens > 0 && tokens > lim.MaxVisualTokens {
		return mediaError(fmt.Sprintf("the request's images come to about %d visual tokens; model %q allows at most %d per prompt", tokens, x.asked, lim.MaxVisualTokens))
	}
	return nil
}

// mediaScan is what a chat's content parts carry besides text: items per
// modality, and the pixels and estimated visual tokens (Qwen2VLImageTokens)
// of its inlined images.
type mediaScan struct {
	counts       map[string]int
	items        int
	pixels       int64
	visualTokens int
}

// scanMedia reads the media parts of req's chat messages (none for other
// kinds).
func scanMedia(req *request) mediaScan {
	var ms mediaScan
	if req.kind != kindChat {
		return ms
	}
	if req.msgVals != nil {
		return scanMediaValues(req.msgVals)
	}
	var counts map[string]int // made at the first item: text chats allocate nothing
	var pixels int64
	tokens := 0
	for _, raw := range req.messages {
		if bytes.IndexByte(raw, '[') < 0 {
			continue // no list of parts (an escaped key could hide "type", not '[')
		}
		var msg struct {
			Content json.RawMessage `json:"content"`
		}
		if json.Unmarshal(raw, &msg) != nil || len(msg.Content) == 0 || msg.Content[0] != '[' {
			continue
		}
		var parts []struct {
			Type     string `json:"type"`
			ImageURL *struct {
				URL string `json:"url"`
			} `json:"image_url"`
		}
		if json.Unmarshal(msg.Content, &parts) != nil {
			continue
		}
		for _, p := range parts {
			mod := mediaModality(p.Type)
			if mod == "" {
				continue
			}
			if counts == nil {
				counts = map[string]int{}
			}
			counts[mod]++
			if p.ImageURL != nil {
				if w, h, ok := dataURLSize(p.ImageURL.URL); ok {
					pixels += int64(w) * int64(h)
					tokens += Qwen2VLImageTokens(w, h)
				}
			}
			ms.items++
		}
	}
	ms.counts, ms.pixels, ms.visualTokens = counts, pixels, tokens
	return ms
}

func mediaError(msg string) *apiError {
	return &apiError{status: http.StatusBadRequest, typ: typeInvalidRequest, param: "messages", message: msg}
}

// dataURLSize reads the width and height of a data:image/...;base64 URL's
// image from its header (PNG, JPEG, GIF); ok is false for other URLs and
// undecodable data.
func dataURLSize(u string) (w, h int, ok bool) {
	rest, found := strings.CutPrefix(u, "data:image/")
	if !found {
		return 0, 0, false
	}
	_, data, found := strings.Cut(rest, ";base64,")
	if !found {
		return 0, 0, false
	}
	// A header is in the first bytes; decode at most 64 KiB of base64.
	if len(data) > 64<<10 {
		data = data[:64<<10]
	}
	raw, err := base64.StdEncoding.DecodeString(data[:len(data)/4*4])
	if err != nil {
		return 0, 0, false
	}
	cfg, _, err := image.DecodeConfig(bytes.NewReader(raw))
	if err != nil {
		return 0, 0, false
	}
	return cfg.Width, cfg.Height, true
}
