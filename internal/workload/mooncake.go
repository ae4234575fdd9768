package workload

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"
)

// MooncakeBlockTokens is the block size of the Mooncake traces' hash_ids, in
// tokens (Mooncake FAST'25 release, FAST25-release/traces/README).
const MooncakeBlockTokens = 512

// ErrMalformed is wrapped by every error about a trace line that does not
// follow the Mooncake format.
var ErrMalformed = errors.New("malformed trace line")

// TraceRecord is one line of a Mooncake FAST'25 trace.
type TraceRecord struct {
	// Timestamp is the arrival in milliseconds from the trace start.
	Timestamp int64 `json:"timestamp"`
	// InputLength is the prompt length in tokens (>= 1).
	InputLength int `json:"input_length"`
	// OutputLength is the number of generated tokens (>= 0).
	OutputLength int `json:"output_length"`
	// HashIDs holds one id per 512-token block of the prompt, the last one
	// partial: len(HashIDs) == ceil(InputLength/512). Equal ids mean equal
	// block content and equal prefix up to the block.
	HashIDs []int64 `json:"hash_ids"`
}

// maxHashID bounds hash ids so they fit a segment key's low 56 bits.
const maxHashID = 1<<56 - 1

// maxInputLength bounds a prompt (tokens): far above any real model's
// context, low enough that a hostile line cannot ask for gigabytes.
const maxInputLength = 1 << 24

// ParseTraceLine decodes one JSON line of a Mooncake trace and checks it:
// all four fields present, timestamp >= 0, input_length in 1..2^24,
// output_length >= 0, hash ids in 0..2^56-1, and ceil(input_length/512)
// hash ids. Unknown fields are ignored. Errors wrap ErrMalformed.
func ParseTraceLine(line []byte) (TraceRecord, error) {
	var raw struct {
		Timestamp    *int64  `json:"timestamp"`
		InputLength  *int    `json:"input_length"`
		OutputLength *int    `json:"output_length"`
		HashIDs      []int64 `json:"hash_ids"`
	}
	if err := json.Unmarshal(line, &raw); err != nil {
		return TraceRecord{}, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	switch {
	case raw.Timestamp == nil:
		return TraceRecord{}, fmt.Errorf("%w: timestamp missing", ErrMalformed)
	case raw.InputLength == nil:
		return TraceRecord{}, fmt.Errorf("%w: input_length missing", ErrMalformed)
	case raw.OutputLength == nil:
		return TraceRecord{}, fmt.Errorf("%w: output_length missing", ErrMalformed)
	case raw.HashIDs == nil:
		return TraceRecord{}, fmt.Errorf("%w: hash_ids missing", ErrMalformed)
	}
	r := TraceRecord{Timestamp: *raw.Timestamp, InputLength: *raw.InputLength, OutputLength: *raw.OutputLength, HashIDs: raw.HashIDs}
	switch {
	case r.Timestamp < 0:
		return r, fmt.Errorf("%w: timestamp %d < 0", ErrMalformed, r.Timestamp)
	case r.InputLength < 1 || r.InputLength > maxInputLength:
		return r, fmt.Errorf("%w: input_length %d not in 1..%d", ErrMalformed, r.InputLength, maxInputLength)
	case r.OutputLength < 0:
		return r, fmt.Errorf("%w: output_length %d < 0", ErrMalformed, r.OutputLength)
	}
	if want := (r.InputLength + MooncakeBlockTokens - 1) / MooncakeBlockTokens; len(r.HashIDs) != want {
		return r, fmt.Errorf("%w: %d hash_ids for input_length %d, want %d", ErrMalformed, len(r.HashIDs), r.InputLength, want)
	}
	for i, h := range r.HashIDs {
		if h < 0 || h > maxHashID {
			return r, fmt.Errorf("%w: hash_ids[%d] = %d out of range", ErrMalformed, i, h)
		}
	}
	return r, nil
}

// ReadTrace reads a Mooncake trace, plain JSON lines or gzip (detected by
// its magic bytes), skipping blank lines. An error names the 1-based line.
func ReadTrace(r io.Reader) ([]TraceRecord, error) {
	br := bufio.NewReader(r)
	if magic, err := br.Peek(2); err == nil && bytes.Equal(magic, []byte{0x1f, 0x8b}) {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("read trace: %w", err)
		}
		defer zr.Close()
		br = bufio.NewReader(zr)
	}
	sc := bufio.NewScanner(br)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	var out []TraceRecord
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		rec, err := ParseTraceLine(line)
		if err != nil {
			return nil, fmt.Errorf("read trace: line %d: %w", n, err)
		}
		out = append(out, rec)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read trace: %w", err)
	}
	return out, nil
}

// MooncakeOptions selects and scales a slice of a trace.
type MooncakeOptions struct {
	// Speed divides the trace's inter-arrival times: 2 replays an hour in
	// half an hour. Zero means 1.
	Speed float64
	// Skip drops the first Skip records.
	Skip int
	// Limit keeps at most Limit records after Skip; zero keeps all.
	Limit int
	// MaxInputTokens truncates longer prompts to this many tokens (whole
	// segments kept, the last one cut); zero keeps them whole. Useful when
	// engines have a small context.
	MaxInputTokens int
	// MaxOutputTokens caps output lengths; zero keeps them.
	MaxOutputTokens int
}

// Mooncake turns trace records into a workload. Request i gets ID
// "mooncake-%06d" (its index in the trace), arrival (timestamp -
// first timestamp of the slice) / Speed, one segment per hash id (512
// tokens, the last input_length - 512*(n-1)), and no session (the trace
// carries none).
func Mooncake(recs []TraceRecord, opt MooncakeOptions) (*Workload, error) {
	if opt.Speed == 0 {
		opt.Speed = 1
	}
	if opt.Speed < 0 || opt.Skip < 0 || opt.Limit < 0 || opt.MaxInputTokens < 0 || opt.MaxOutputTokens < 0 {
		return nil, fmt.Errorf("mooncake: negative option in %+v", opt)
	}
	recs = recs[min(opt.Skip, len(recs)):]
	if opt.Limit > 0 && opt.Limit < len(recs) {
		recs = recs[:opt.Limit]
	}
	w := &Workload{
		Name: "mooncake",
		Params: map[string]string{
			"speed": fmt.Sprint(opt.Speed),
			"skip":  fmt.Sprint(opt.Skip),
			"limit": fmt.Sprint(opt.Limit),
		},
		Requests: make([]Request, len(recs)),
	}
	if len(recs) == 0 {
		return w, nil
	}
	t0 := recs[0].Timestamp
	for i, rec := range recs {
		if rec.Timestamp < t0 {
			return nil, fmt.Errorf("mooncake: record %d goes back in time (%d < %d ms)", opt.Skip+i, rec.Timestamp, t0)
		}
		prompt := make([]Segment, 0, len(rec.HashIDs))
		left := rec.InputLength
		if opt.MaxInputTokens > 0 {
			left = min(left, opt.MaxInputTokens)
		}
		for _, h := range rec.HashIDs {
			if left <= 0 {
				break
			}
			n := min(MooncakeBlockTokens, left)
			prompt = append(prompt, Segment{Key: nsMooncake<<56 | uint64(h), Len: n})
			left -= n
		}
		out := rec.OutputLength
		if opt.MaxOutputTokens > 0 {
			out = min(out, opt.MaxOutputTokens)
		}
		w.Requests[i] = Request{
			ID:           fmt.Sprintf("mooncake-%06d", opt.Skip+i),
			At:           time.Duration(float64(rec.Timestamp-t0) * float64(time.Millisecond) / opt.Speed),
			Prompt:       prompt,
			OutputTokens: out,
		}
	}
	sortByArrival(w.Requests)
	return w, nil
}
