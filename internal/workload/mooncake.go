package workload

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"time"
)

// MooncakeBlockTokens is the block size of the Mooncake traces' hash_ids, in
// tokens (Mooncake FAST'25 release, FAST25-release/traces/README).
const MooncakeBlockTokens = 512

// ErrMalformed is wrapped by every error about a trace line that does not
// follow the Mooncake format.
var ErrMalformed = errors.New("malformed trace line")

// BailianBlockTokens is the block size of the Alibaba Qwen-Bailian KV-cache
// traces' hash_ids, in tokens (alibaba-edu/qwen-bailian-usagetraces-anon
// README: "Salted SipHash blocks (16 tokens per block)").
const BailianBlockTokens = 16

// TraceRecord is one line of a trace: the Mooncake FAST'25 layout, or the
// Qwen-Bailian one (see ParseTraceLine), which ReadTrace turns into the same
// record.
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
	// SessionID names the conversation the request belongs to ("" when
	// the trace does not tell): a Mooncake line's optional session_id (a
	// string or an integer, kept as its decimal text), or, for a Bailian
	// line, "chat-N" with N the chat_id of the conversation's first request
	// (ReadTrace follows parent_chat_id; ParseTraceLine alone cannot).
	SessionID string `json:"session_id,omitempty"`
	// BlockTokens is the tokens per hash id: 0 for Mooncake lines (512,
	// MooncakeBlockTokens), BailianBlockTokens for Bailian ones.
	BlockTokens int `json:"-"`
	// ChatID and ParentChatID are a Bailian line's chat_id and
	// parent_chat_id (-1: the conversation's first request); Turn its
	// turn; Type its type (text, search, image, file). All zero for
	// Mooncake lines.
	ChatID, ParentChatID int64  `json:"-"`
	Turn                 int    `json:"-"`
	Type                 string `json:"-"`
}

// maxSessionID bounds a session_id's length in bytes.
const maxSessionID = 256

// maxTimestampSeconds bounds a Bailian timestamp (about 31 years), so that
// its milliseconds fit an int64 with room to spare.
const maxTimestampSeconds = 1e9

// maxHashID bounds hash ids so they fit a segment key's low 56 bits.
const maxHashID = 1<<56 - 1

// maxInputLength bounds a prompt (tokens): far above any real model's
// context, low enough that a hostile line cannot ask for gigabytes.
const maxInputLength = 1 << 24

// ParseTraceLine decodes one JSON line of a trace and checks it. A line
// with a chat_id is in the Qwen-Bailian layout (parseBailian); any other is
// a Mooncake line: all four fields present, timestamp >= 0 (milliseconds),
// input_length in 1..2^24, output_length >= 0, hash ids in 0..2^56-1, and
// ceil(input_length/512) hash ids; an optional session_id, a string or an
// integer of at most 256 bytes. Unknown fields are ignored. Errors wrap
// ErrMalformed.
func ParseTraceLine(line []byte) (TraceRecord, error) {
	var probe struct {
		ChatID json.RawMessage `json:"chat_id"`
	}
	if err := json.Unmarshal(line, &probe); err != nil {
		return TraceRecord{}, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if probe.ChatID != nil {
		return parseBailian(line)
	}
	var raw struct {
		Timestamp    *int64          `json:"timestamp"`
		InputLength  *int            `json:"input_length"`
		OutputLength *int            `json:"output_length"`
		HashIDs      []int64         `json:"hash_ids"`
		SessionID    json.RawMessage `json:"session_id"`
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
	if raw.SessionID != nil {
		id, err := sessionID(raw.SessionID)
		if err != nil {
			return r, err
		}
		r.SessionID = id
	}
	switch {
	case r.Timestamp < 0:
		return r, fmt.Errorf("%w: timestamp %d < 0", ErrMalformed, r.Timestamp)
	case r.InputLength < 1 || r.InputLength > maxInputLength:
		return r, fmt.Errorf("%w: input_length %d not in 1..%d", ErrMalformed, r.InputLength, maxInputLength)
	case r.OutputLength < 0:
		return r, fmt.Errorf("%w: output_length %d < 0", ErrMalformed, r.OutputLength)
	}
	return r, checkHashIDs(&r)
}

// checkHashIDs checks that r has one hash id in 0..2^56-1 per BlockTokens
// (0: 512) of its input, the last one partial.
func checkHashIDs(r *TraceRecord) error {
	bt := r.BlockTokens
	if bt <= 0 {
		bt = MooncakeBlockTokens
	}
	if want := (r.InputLength + bt - 1) / bt; len(r.HashIDs) != want {
		return fmt.Errorf("%w: %d hash_ids for input_length %d, want %d (%d-token blocks)", ErrMalformed, len(r.HashIDs), r.InputLength, want, bt)
	}
	for i, h := range r.HashIDs {
		if h < 0 || h > maxHashID {
			return fmt.Errorf("%w: hash_ids[%d] = %d out of range", ErrMalformed, i, h)
		}
	}
	return nil
}

// sessionID decodes a session_id: a JSON string, or an integer kept as its
// decimal text; empty, longer than maxSessionID or anything else is
// malformed.
func sessionID(raw json.RawMessage) (string, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		var n int64
		if err := json.Unmarshal(raw, &n); err != nil {
			return "", fmt.Errorf("%w: session_id %.40s: want a string or an integer", ErrMalformed, raw)
		}
		s = strconv.FormatInt(n, 10)
	}
	if s == "" || len(s) > maxSessionID {
		return "", fmt.Errorf("%w: session_id of %d bytes: want 1..%d", ErrMalformed, len(s), maxSessionID)
	}
	return s, nil
}

// parseBailian decodes a line of the Qwen-Bailian KV-cache traces
// (alibaba-edu/qwen-bailian-usagetraces-anon README, "Data Specification of
// the Traces"): chat_id (>= 0), parent_chat_id (-1 for a conversation's
// first request, else >= 0), timestamp (seconds since the trace start, >=
// 0; kept in milliseconds, rounded), input_length in 1..2^24,
// output_length >= 0, turn (>= 0), hash_ids (ceil(input_length/16) ids in
// 0..2^56-1) are required; type (text, search, image, file) is optional.
// SessionID is left for ReadTrace, which follows parent_chat_id.
func parseBailian(line []byte) (TraceRecord, error) {
	var raw struct {
		ChatID       *int64   `json:"chat_id"`
		ParentChatID *int64   `json:"parent_chat_id"`
		Timestamp    *float64 `json:"timestamp"`
		InputLength  *int     `json:"input_length"`
		OutputLength *int     `json:"output_length"`
		Type         string   `json:"type"`
		Turn         *int     `json:"turn"`
		HashIDs      []int64  `json:"hash_ids"`
	}
	if err := json.Unmarshal(line, &raw); err != nil {
		return TraceRecord{}, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	for _, f := range []struct {
		name    string
		missing bool
	}{
		{"chat_id", raw.ChatID == nil}, {"parent_chat_id", raw.ParentChatID == nil}, {"timestamp", raw.Timestamp == nil},
		{"input_length", raw.InputLength == nil}, {"output_length", raw.OutputLength == nil}, {"turn", raw.Turn == nil},
		{"hash_ids", raw.HashIDs == nil},
	} {
		if f.missing {
			return TraceRecord{}, fmt.Errorf("%w: %s missing", ErrMalformed, f.name)
		}
	}
	r := TraceRecord{InputLength: *raw.InputLength, OutputLength: *raw.OutputLength, HashIDs: raw.HashIDs,
		BlockTokens: BailianBlockTokens, ChatID: *raw.ChatID, ParentChatID: *raw.ParentChatID, Turn: *raw.Turn, Type: raw.Type}
	ts := *raw.Timestamp
	switch {
	case r.ChatID < 0:
		return r, fmt.Errorf("%w: chat_id %d < 0", ErrMalformed, r.ChatID)
	case r.ParentChatID < -1:
		return r, fmt.Errorf("%w: parent_chat_id %d < -1", ErrMalformed, r.ParentChatID)
	case !(ts >= 0 && ts <= maxTimestampSeconds):
		return r, fmt.Errorf("%w: timestamp %v not in 0..%v s", ErrMalformed, ts, float64(maxTimestampSeconds))
	case r.InputLength < 1 || r.InputLength > maxInputLength:
		return r, fmt.Errorf("%w: input_length %d not in 1..%d", ErrMalformed, r.InputLength, maxInputLength)
	case r.OutputLength < 0:
		return r, fmt.Errorf("%w: output_length %d < 0", ErrMalformed, r.OutputLength)
	case r.Turn < 0:
		return r, fmt.Errorf("%w: turn %d < 0", ErrMalformed, r.Turn)
	case len(r.Type) > maxSessionID:
		return r, fmt.Errorf("%w: type of %d bytes", ErrMalformed, len(r.Type))
	}
	r.Timestamp = int64(math.Round(ts * 1000))
	return r, checkHashIDs(&r)
}

// linkSessions gives each Bailian record of recs (in file order) the
// session of its conversation: "chat-N", N the chat_id of the first request
// reached by following parent_chat_id through earlier records; a parent not
// in recs (the trace starts mid-conversation) is taken as that first
// request. Mooncake records are left as they are.
func linkSessions(recs []TraceRecord) {
	root := map[int64]int64{}
	for i := range recs {
		r := &recs[i]
		if r.BlockTokens != BailianBlockTokens {
			continue
		}
		top := r.ChatID
		if r.ParentChatID >= 0 {
			top = r.ParentChatID
			if p, ok := root[r.ParentChatID]; ok {
				top = p
			}
		}
		root[r.ChatID] = top
		r.SessionID = "chat-" + strconv.FormatInt(top, 10)
	}
}

// ReadTrace reads a trace, plain JSON lines or gzip (detected by its magic
// bytes), skipping blank lines; each line may be in either layout
// (ParseTraceLine), and Bailian lines get their conversation's SessionID.
// An error names the 1-based line.
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
	linkSessions(out)
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
// first timestamp of the slice) / Speed, one segment per hash id
// (BlockTokens, 512 when 0; the last input_length - BlockTokens*(n-1);
// Mooncake and Bailian ids in separate key spaces), and the record's
// SessionID as its session.
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
		bt, ns := rec.BlockTokens, uint64(nsMooncake)
		if bt <= 0 {
			bt = MooncakeBlockTokens
		}
		if bt == BailianBlockTokens {
			ns = nsBailian
		}
		left := rec.InputLength
		if opt.MaxInputTokens > 0 {
			left = min(left, opt.MaxInputTokens)
		}
		for _, h := range rec.HashIDs {
			if left <= 0 {
				break
			}
			n := min(bt, left)
			prompt = append(prompt, Segment{Key: ns<<56 | uint64(h), Len: n})
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
			Session:      rec.SessionID,
		}
	}
	sortByArrival(w.Requests)
	return w, nil
}
