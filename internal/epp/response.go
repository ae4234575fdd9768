package epp

import (
	"bytes"
	"encoding/json"
)

// usage is what an engine reported of a request in OpenAI's usage object
// (vLLM: prompt_tokens_details.cached_tokens with
// --enable-prompt-tokens-details).
type usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	PromptTokensDetails *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

// maxTracked bounds what the tracker holds of a response: a JSON body up
// to this many bytes, or one event line of a stream. Past it the usage of
// that body or line is not read (the response still goes through whole).
const maxTracked = 1 << 20

// tracker reads a response as it passes: a JSON body's usage and error,
// or, for an event stream, the usage of its last event carrying one and
// whether an event carried an error. Not safe for concurrent use.
type tracker struct {
	sse     bool
	buf     []byte // JSON body so far, or the event line being read
	over    bool   // buf passed maxTracked
	usage   *usage
	errored bool // an error event, or an error body
	done    bool // "data: [DONE]" seen
	events  int  // event-stream data lines read whole (the [DONE] line too)
}

// feed reads the next chunk of the response body.
func (t *tracker) feed(b []byte) {
	if !t.sse {
		if t.over || len(t.buf)+len(b) > maxTracked {
			t.over, t.buf = true, nil
			return
		}
		t.buf = append(t.buf, b...)
		return
	}
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			t.appendLine(b)
			return
		}
		t.appendLine(b[:i])
		if !t.over {
			t.line(t.buf)
		}
		t.buf, t.over = t.buf[:0], false
		b = b[i+1:]
	}
}

func (t *tracker) appendLine(b []byte) {
	if t.over || len(t.buf)+len(b) > maxTracked {
		t.over, t.buf = true, t.buf[:0]
		return
	}
	t.buf = append(t.buf, b...)
}

// line reads one event-stream line.
func (t *tracker) line(l []byte) {
	l = bytes.TrimRight(l, "\r")
	data, ok := bytes.CutPrefix(l, []byte("data:"))
	if !ok {
		return
	}
	t.events++
	data = bytes.TrimSpace(data)
	if string(data) == "[DONE]" {
		t.done = true
		return
	}
	t.object(data)
}

// object reads a JSON object's usage and error.
func (t *tracker) object(data []byte) {
	if !bytes.Contains(data, []byte(`"usage"`)) && !bytes.Contains(data, []byte(`"error"`)) {
		return // most events: no decode
	}
	var v struct {
		Usage *usage          `json:"usage"`
		Error json.RawMessage `json:"error"`
	}
	if json.Unmarshal(data, &v) != nil {
		return
	}
	if v.Usage != nil {
		t.usage = v.Usage
	}
	if len(v.Error) > 0 && string(v.Error) != "null" {
		t.errored = true
	}
}

// end reads what a JSON body held once it is complete.
func (t *tracker) end() {
	if !t.sse && !t.over {
		t.object(t.buf)
	}
	if t.sse && !t.over && len(t.buf) > 0 {
		t.line(t.buf)
	}
	t.buf = nil
}
