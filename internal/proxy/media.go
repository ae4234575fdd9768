package proxy

import (
	"context"
	"fmt"

	"kvrouter/internal/admission"
	"kvrouter/internal/config"
	"kvrouter/internal/request"
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

// mediaFeature is a group's media limits, checked before routing.
type mediaFeature struct{}

// Admit applies x's media limits to its chat messages (x.Media).
func (mediaFeature) Admit(_ context.Context, x *admission.Flow) *request.Error { return checkMedia(x) }

// mediaLimits returns the limits for x: its alias's when set, else its
// group's (nil: none).
func mediaLimits(x *admission.Flow) *config.MediaLimits {
	if al := x.Group.Alias(x.Asked); al != nil && al.Media != nil {
		return al.Media
	}
	return x.Group.Cfg.Media
}

// checkMedia applies x's media limits to its chat messages (x.Media).
func checkMedia(x *admission.Flow) *request.Error {
	lim := mediaLimits(x)
	if lim == nil || x.Req.Kind != request.Chat {
		return nil
	}
	counts, pixels, tokens := x.Media.Counts, x.Media.Pixels, x.Media.VisualTokens
	for mod, n := range counts {
		if most, ok := lim.MaxItems[mod]; ok && n > most {
			return mediaError(fmt.Sprintf("at most %d %s item(s) may be given in one prompt for model %q; the request has %d", most, mod, x.Asked, n))
		}
	}
	if lim.MaxPixels > 0 && pixels > lim.MaxPixels {
		return mediaError(fmt.Sprintf("the request's images have %d pixels; model %q allows at most %d per prompt", pixels, x.Asked, lim.MaxPixels))
	}
	if lim.MaxVisualTokens > 0 && tokens > lim.MaxVisualTokens {
		return mediaError(fmt.Sprintf("the request's images come to about %d visual tokens; model %q allows at most %d per prompt", tokens, x.Asked, lim.MaxVisualTokens))
	}
	return nil
}

func mediaError(msg string) *request.Error {
	return request.Invalid("messages", msg)
}
