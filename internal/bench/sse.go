package bench

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// ErrMalformed is wrapped by errors about a stream or metrics page that
// does not follow the expected format.
var ErrMalformed = errors.New("malformed response")

// chunk is what bench reads from one SSE event of an OpenAI completions
// stream (vLLM's CompletionStreamResponse; chat deltas are read too).
type chunk struct {
	Choices []struct {
		Text  string `json:"text"`
		Delta struct {
			Content string `json:"content"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *usage `json:"usage"`
	Error *struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    any    `json:"code"`
	} `json:"error"`
}

// usage is OpenAI's usage object with vLLM's cached-token detail.
type usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	PromptTokensDetails *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

// sseEvent is one decoded event: a chunk, or done for "data: [DONE]".
type sseEvent struct {
	done bool
	c    chunk
}

// hasToken reports whether the chunk carries generated output: a choice
// with text, or with no finish reason (a token may decode to an empty
// string while its UTF-8 sequence is incomplete). A choice with empty text
// and a finish reason only closes the stream.
func (c *chunk) hasToken() bool {
	if len(c.Choices) == 0 {
		return false
	}
	ch := &c.Choices[0]
	return ch.Text != "" || ch.Delta.Content != "" || ch.FinishReason == nil
}

// parseData decodes the payload of one "data:" field.
func parseData(data []byte) (sseEvent, error) {
	data = bytes.TrimSpace(data)
	if bytes.Equal(data, []byte("[DONE]")) {
		return sseEvent{done: true}, nil
	}
	var ev sseEvent
	if err := json.Unmarshal(data, &ev.c); err != nil {
		return ev, fmt.Errorf("%w: sse data: %v", ErrMalformed, err)
	}
	return ev, nil
}

// sseReader reads an SSE stream event by event (WHATWG "server-sent
// events": lines, "data:" fields joined by newlines, a blank line ends the
// event; comments and other fields are ignored).
type sseReader struct {
	r    *bufio.Reader
	data []byte
}

func newSSEReader(r io.Reader) *sseReader { return &sseReader{r: bufio.NewReaderSize(r, 16<<10)} }

// maxEventBytes bounds one event so a broken server cannot exhaust memory.
const maxEventBytes = 4 << 20

// next returns the next event's data, or io.EOF at the end of the stream.
func (s *sseReader) next() ([]byte, error) {
	s.data = s.data[:0]
	have := false
	for {
		line, err := s.r.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			return nil, fmt.Errorf("%w: sse line longer than %d bytes", ErrMalformed, s.r.Size())
		}
		if len(line) == 0 && err != nil {
			if have {
				return s.data, nil
			}
			return nil, err
		}
		line = bytes.TrimRight(line, "\r\n")
		switch {
		case len(line) == 0:
			if have {
				return s.data, nil
			}
		case bytes.HasPrefix(line, []byte("data:")):
			v := bytes.TrimPrefix(line[5:], []byte(" "))
			if have {
				s.data = append(s.data, '\n')
			}
			s.data = append(s.data, v...)
			have = true
			if len(s.data) > maxEventBytes {
				return nil, fmt.Errorf("%w: sse event longer than %d bytes", ErrMalformed, maxEventBytes)
			}
		}
		if err != nil {
			if have {
				return s.data, nil
			}
			return nil, err
		}
	}
}
