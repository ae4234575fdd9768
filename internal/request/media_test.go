package request

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"image"
	"image/png"
	"strings"
	"testing"
)

// BenchmarkScanMedia: the per-request cost of reading a chat's media parts
// (every chat pays it, for the limits and the keys): a 10-message text chat,
// and one 896x896 PNG data URL with a question.
func BenchmarkScanMedia(b *testing.B) {
	var text []string
	for i := range 10 {
		text = append(text, fmt.Sprintf(`{"role":"user","content":"message %d: %s"}`, i, strings.Repeat("words ", 40)))
	}
	var buf bytes.Buffer
	if err := png.Encode(&buf, image.NewGray(image.Rect(0, 0, 896, 896))); err != nil {
		b.Fatal(err)
	}
	url := "data:image/png;base64," + base64.StdEncoding.EncodeToString(buf.Bytes())
	for _, bc := range []struct{ name, body string }{
		{"text-10-messages", `{"model":"m","messages":[` + strings.Join(text, ",") + `]}`},
		{"one-image", `{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"` + url + `"}},{"type":"text","text":"what is it?"}]}]}`},
	} {
		req, aerr := Parse(Chat, []byte(bc.body))
		if aerr != nil {
			b.Fatal(aerr.Message)
		}
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if ms := req.Media(); ms.Items != strings.Count(bc.name, "image") {
					b.Fatalf("%d items", ms.Items)
				}
			}
		})
	}
}
