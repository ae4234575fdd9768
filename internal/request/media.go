package request

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"image"
	_ "image/gif" // image.DecodeConfig of data URLs
	_ "image/jpeg"
	_ "image/png"
	"strings"

	"kvrouter/internal/vllm"
)

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

// Media is what a chat's content parts carry besides text: items per
// modality, and the pixels and estimated visual tokens
// (vllm.Qwen2VLImageTokens) of its images inlined as data: URLs (PNG,
// JPEG, GIF headers); an image given by http(s) URL counts as an item
// only.
type Media struct {
	// Counts maps a modality (image, audio, video) to its items; nil when
	// there are none.
	Counts map[string]int
	// Items is the number of media parts, all modalities.
	Items int
	// Pixels is the sum of width*height over the inlined images.
	Pixels int64
	// VisualTokens is the inlined images' estimated visual tokens.
	VisualTokens int
}

// Media reads the media parts of the request's chat messages (none for
// other kinds), with the modalities vLLM's chat parser names
// (vllm/entrypoints/chat_utils.py).
func (req *Parsed) Media() Media {
	var ms Media
	if req.Kind != Chat {
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
					tokens += vllm.Qwen2VLImageTokens(w, h)
				}
			}
			ms.Items++
		}
	}
	ms.Counts, ms.Pixels, ms.VisualTokens = counts, pixels, tokens
	return ms
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
