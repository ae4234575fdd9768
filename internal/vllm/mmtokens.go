package vllm

import "math"

// Qwen2.5-VL's image processor (the model's preprocessor_config.json:
// patch_size 14, merge_size 2, min_pixels 3136, max_pixels 12845056)
// resizes an image so that both sides are multiples of 28 (14 x 2) within
// the pixel bounds, then merges each 2x2 group of 14-pixel patches into one
// token: tokens = H*W / (14*14*4) after resizing.
const (
	qwenVLFactor    = 28
	qwenVLMinPixels = 3136
	qwenVLMaxPixels = 12845056
)

// Qwen2VLImageTokens returns the visual tokens of a w x h image under
// Qwen2.5-VL's resizing (896x896 -> 1,024; 0 for an empty image): the
// number of <|image_pad|> placeholders the model's processor expands the
// image to (transformers' Qwen2VLImageProcessor smart_resize, with the
// defaults above), which vLLM applies. Other models count differently.
func Qwen2VLImageTokens(w, h int) int {
	if w <= 0 || h <= 0 {
		return 0
	}
	f := float64(qwenVLFactor)
	rw := max(math.Round(float64(w)/f)*f, f)
	rh := max(math.Round(float64(h)/f)*f, f)
	px := float64(w) * float64(h)
	switch {
	case rw*rh > qwenVLMaxPixels:
		beta := math.Sqrt(px / qwenVLMaxPixels)
		rw = max(math.Floor(float64(w)/beta/f)*f, f)
		rh = max(math.Floor(float64(h)/beta/f)*f, f)
	case rw*rh < qwenVLMinPixels:
		beta := math.Sqrt(qwenVLMinPixels / px)
		rw = math.Ceil(float64(w)*beta/f) * f
		rh = math.Ceil(float64(h)*beta/f) * f
	}
	return int(rw/f) * int(rh/f)
}
