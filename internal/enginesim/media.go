package enginesim

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"image"
	_ "image/gif" // image.DecodeConfig of data URLs
	_ "image/jpeg"
	_ "image/png"
	"strings"

	"kvrouter/internal/vllm"
)

// Images in chat requests. The simulator stands in for a Qwen2.5-VL-style
// vision encoder, deterministically: each image_url part must be a
// data:image/...;base64 URL (PNG, JPEG or GIF; the simulator fetches
// nothing); it becomes one run of placeholder tokens, as many as
// vllm.Qwen2VLImageTokens gives for the image's size (896x896 -> 1,024),
// at the place of the part in the rendered chat; its identifier (vLLM's
// mm_hash) is the SHA-256 hex digest of the image's bytes. The rendered
// chat's ids and items are what /v1/chat/completions/render answers (in
// vLLM's "features" shape) and what the engine caches, with the items as
// extra keys of the blocks they overlap.
//
// How: each image part is replaced by a text part "<|image_pad|>" before
// the Tokenizer renders the chat; the ids of that text (one id with a
// Qwen tokenizer, where it is a special token; 13 byte ids with
// ByteTokenizer) are then found in order and each occurrence replaced by
// the image's placeholder run. The placeholder id is the text's id when it
// is one token, else VocabSize-1. A prompt whose own text holds
// "<|image_pad|>" is refused (400), as the occurrences would not match the
// images.
const imagePadText = "<|image_pad|>"

// chatImage is one image of a chat: its identifier and placeholder count.
type chatImage struct {
	id     string
	tokens int
}

// chatImages returns body with every image part replaced by the text part
// imagePadText, and the images in order; body itself when it has none.
// Errors wrap errBadRequest.
func chatImages(body []byte) ([]byte, []chatImage, error) {
	if !bytes.Contains(body, []byte("image")) && !bytes.Contains(body, []byte("audio")) &&
		!bytes.Contains(body, []byte("video")) && !bytes.Contains(body, []byte(`\u`)) {
		return body, nil, nil // no part type can be spelt without these (an escape: \u)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil {
		return nil, nil, fmt.Errorf("%w: %v", errBadRequest, err)
	}
	var msgs []json.RawMessage
	if err := json.Unmarshal(top["messages"], &msgs); err != nil {
		return nil, nil, fmt.Errorf("%w: messages: %v", errBadRequest, err)
	}
	var imgs []chatImage
	changed := false
	for i, raw := range msgs {
		var msg map[string]json.RawMessage
		if json.Unmarshal(raw, &msg) != nil {
			continue // the renderer reports it
		}
		var parts []json.RawMessage
		if c := bytes.TrimSpace(msg["content"]); len(c) == 0 || c[0] != '[' || json.Unmarshal(c, &parts) != nil {
			continue
		}
		partChanged := false
		for j, p := range parts {
			var part struct {
				Type     string `json:"type"`
				ImageURL *struct {
					URL string `json:"url"`
				} `json:"image_url"`
			}
			if json.Unmarshal(p, &part) != nil {
				continue
			}
			switch part.Type {
			case "image_url":
			case "input_image", "image", "image_pil", "image_embeds", "audio_url", "input_audio", "audio", "video_url", "video":
				return nil, nil, fmt.Errorf("%w: messages[%d].content[%d]: the simulator takes images as image_url parts only, not %q", errBadRequest, i, j, part.Type)
			default:
				continue
			}
			if part.ImageURL == nil {
				return nil, nil, fmt.Errorf("%w: messages[%d].content[%d]: image_url.url is required", errBadRequest, i, j)
			}
			img, err := decodeImage(part.ImageURL.URL)
			if err != nil {
				return nil, nil, fmt.Errorf("%w: messages[%d].content[%d]: %v", errBadRequest, i, j, err)
			}
			imgs = append(imgs, img)
			parts[j] = json.RawMessage(`{"type":"text","text":"` + imagePadText + `"}`)
			partChanged = true
		}
		if partChanged {
			msg["content"], _ = json.Marshal(parts)
			msgs[i], _ = json.Marshal(msg)
			changed = true
		}
	}
	if !changed {
		return body, nil, nil
	}
	top["messages"], _ = json.Marshal(msgs)
	out, err := json.Marshal(top)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %v", errBadRequest, err)
	}
	return out, imgs, nil
}

// decodeImage reads a data:image/...;base64 URL: its SHA-256 identifier
// and its Qwen2.5-VL placeholder count.
func decodeImage(u string) (chatImage, error) {
	rest, ok := strings.CutPrefix(u, "data:image/")
	if !ok {
		return chatImage{}, fmt.Errorf("image_url must be a data:image/...;base64 URL (the simulator fetches nothing)")
	}
	_, data, ok := strings.Cut(rest, ";base64,")
	if !ok {
		return chatImage{}, fmt.Errorf("image_url must be base64-encoded (data:image/...;base64,...)")
	}
	raw, err := base64.StdEncoding.DecodeString(data)
	if err != nil {
		return chatImage{}, fmt.Errorf("image data: %v", err)
	}
	cfg, _, err := image.DecodeConfig(bytes.NewReader(raw))
	if err != nil {
		return chatImage{}, fmt.Errorf("image data: %v", err)
	}
	n := vllm.Qwen2VLImageTokens(cfg.Width, cfg.Height)
	if n == 0 {
		return chatImage{}, fmt.Errorf("image of %dx%d pixels is empty", cfg.Width, cfg.Height)
	}
	sum := sha256.Sum256(raw)
	return chatImage{id: hex.EncodeToString(sum[:]), tokens: n}, nil
}

// encodeChat renders and tokenizes a chat body with its images expanded to
// placeholder runs, returning the ids and the images as multimodal items
// (nil for a text chat). Errors are the client's (400).
func (s *Server) encodeChat(body []byte) ([]uint32, []vllm.MMFeature, error) {
	nb, imgs, err := chatImages(body)
	if err != nil {
		return nil, nil, err
	}
	toks, err := s.tok.EncodeChat(nb)
	if err != nil || len(imgs) == 0 {
		return toks, nil, err
	}
	pad, err := s.tok.Encode(imagePadText, false)
	if err != nil || len(pad) == 0 {
		return nil, nil, fmt.Errorf("%w: cannot tokenize the image placeholder: %v", errBadRequest, err)
	}
	padID := uint32(s.coreCfg.VocabSize - 1)
	if len(pad) == 1 {
		padID = pad[0]
	}
	total := 0
	for _, im := range imgs {
		total += im.tokens
	}
	out := make([]uint32, 0, len(toks)+total)
	mm := make([]vllm.MMFeature, 0, len(imgs))
	for i := 0; i < len(toks); {
		if hasIDs(toks[i:], pad) {
			if len(mm) == len(imgs) {
				return nil, nil, fmt.Errorf("%w: the prompt's text holds %q", errBadRequest, imagePadText)
			}
			im := imgs[len(mm)]
			mm = append(mm, vllm.MMFeature{Identifier: im.id, Offset: len(out), Length: im.tokens})
			for range im.tokens {
				out = append(out, padID)
			}
			i += len(pad)
			continue
		}
		out = append(out, toks[i])
		i++
	}
	if len(mm) != len(imgs) {
		return nil, nil, fmt.Errorf("%w: placed %d of %d images (the chat template dropped some)", errBadRequest, len(mm), len(imgs))
	}
	return out, mm, nil
}

func hasIDs(toks, prefix []uint32) bool {
	if len(toks) < len(prefix) {
		return false
	}
	for i, t := range prefix {
		if toks[i] != t {
			return false
		}
	}
	return true
}
