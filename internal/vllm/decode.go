package vllm

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"

	"github.com/vmihailenco/msgpack/v5"
)

// ErrMalformed is the sentinel every decoding failure unwraps to: the payload
// is not a KVEventBatch this package understands (truncated, wrong types,
// unknown event tag, trailing bytes, nesting too deep).
var ErrMalformed = errors.New("malformed KV event payload")

// DecodeError says what was wrong with a payload and where. It unwraps to
// both ErrMalformed and the underlying cause (e.g. io.ErrUnexpectedEOF for a
// truncated payload), so errors.Is works for either.
type DecodeError struct {
	// Offset is the byte offset in the payload of the value that failed.
	Offset int
	// Field is the path of that value, e.g. "events[2].block_hashes[1]",
	// "ts" or "batch".
	Field string
	// Err is the cause.
	Err error
}

// Error reads like "decode events[2].block_hashes[1] at offset 57: expected
// int or bin, got str".
func (e *DecodeError) Error() string {
	return fmt.Sprintf("decode %s at offset %d: %v", e.Field, e.Offset, e.Err)
}

// Unwrap returns ErrMalformed and the cause.
func (e *DecodeError) Unwrap() []error { return []error{ErrMalformed, e.Err} }

// maxDepth bounds the nesting of skipped values and extra keys, so a hostile
// payload cannot exhaust the stack.
const maxDepth = 32

// DecodeBatch decodes one KV event payload (the third frame of a PUB message)
// into a Batch. It accepts every layout vLLM has published (see the package
// doc): map events (vLLM >= 0.24, unknown keys skipped, fields may appear in
// any order, missing ones are zero) and positional array events (older
// versions, shorter or longer than today's field list). Block hashes may be
// uint64, negative int64 (reinterpreted as uint64) or raw digest bytes
// (reduced to their last 8 bytes read big-endian). A nil medium is stored as
// "" (GPU). Any other problem returns a *DecodeError that unwraps to
// ErrMalformed; DecodeBatch never panics. Fields that do not belong to the
// event's type are skipped, as msgspec does.
func DecodeBatch(payload []byte) (Batch, error) {
	p := &decoder{payload: payload, size: len(payload), ev: -1, idx: -1}
	p.br.Reset(payload)
	p.d = msgpack.GetDecoder()
	p.d.Reset(&p.br)
	b, err := p.batch()
	p.d.Reset(nil)
	msgpack.PutDecoder(p.d)
	return b, err
}

// decoder reads one payload. The msgpack.Decoder reads p.br directly (a
// bytes.Reader is an io.ByteScanner, so it adds no buffering), which keeps
// offsets exact and lets the skip helpers seek.
type decoder struct {
	br      bytes.Reader
	payload []byte
	d       *msgpack.Decoder
	size    int
	// start is the offset of the value being decoded.
	start int
	// ev, field and idx locate the value: events[ev].field[idx]; -1 or ""
	// when not applicable.
	ev    int
	field string
	idx   int
	// scratch holds short strings (map keys, enum values) and raw hashes.
	scratch [64]byte
}

func (p *decoder) off() int { return p.size - p.br.Len() }

// fail wraps err in a DecodeError located at the current value.
func (p *decoder) fail(err error) error {
	if errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	return &DecodeError{Offset: p.start, Field: p.path(), Err: err}
}

func (p *decoder) failf(format string, args ...any) error {
	return p.fail(fmt.Errorf(format, args...))
}

func (p *decoder) path() string {
	var s string
	if p.ev >= 0 {
		s = "events[" + strconv.Itoa(p.ev) + "]"
		if p.field != "" {
			s += "." + p.field
		}
	} else {
		s = p.field
		if s == "" {
			s = "batch"
		}
	}
	if p.idx >= 0 {
		s += "[" + strconv.Itoa(p.idx) + "]"
	}
	return s
}

// peek records the start of the next value and returns its msgpack code.
func (p *decoder) peek() (byte, error) {
	p.start = p.off()
	c, err := p.d.PeekCode()
	if err != nil {
		return 0, p.fail(err)
	}
	return c, nil
}

func (p *decoder) batch() (Batch, error) {
	var b Batch
	n, isNil, err := p.arrayLen()
	if err != nil {
		return b, err
	}
	if isNil || n < 2 {
		return b, p.failf("batch must be an array [ts, events, data_parallel_rank], got %d elements", max(n, 0))
	}
	p.field = "ts"
	if b.TS, err = p.float(); err != nil {
		return b, err
	}
	p.field = "events"
	if b.Events, err = p.events(); err != nil {
		return b, err
	}
	p.ev, p.idx = -1, -1
	if n >= 3 {
		p.field = "data_parallel_rank"
		rank, _, err := p.smallInt(true)
		if err != nil {
			return b, err
		}
		b.DataParallelRank = rank
	}
	for i := 3; i < n; i++ {
		p.field = "batch"
		p.idx = i
		if err := p.skip(0); err != nil {
			return b, err
		}
	}
	p.field, p.idx = "batch", -1
	if p.br.Len() > 0 {
		p.start = p.off()
		return b, p.failf("%d trailing bytes after the batch", p.br.Len())
	}
	return b, nil
}

func (p *decoder) events() ([]Event, error) {
	n, isNil, err := p.arrayLen()
	if err != nil {
		return nil, err
	}
	if isNil {
		return nil, p.failf("events must be an array, got nil")
	}
	evs := make([]Event, n)
	for i := range evs {
		p.ev, p.field, p.idx = i, "", -1
		c, err := p.peek()
		if err != nil {
			return nil, err
		}
		switch {
		case isMapCode(c):
			err = p.mapEvent(&evs[i])
		case isArrayCode(c):
			err = p.arrayEvent(&evs[i])
		default:
			err = p.failf("event must be a map or an array, got %s", codeName(c))
		}
		if err != nil {
			return nil, err
		}
	}
	return evs, nil
}

// fieldID names the fields of the current schema, plus the tag.
type fieldID uint8

const (
	fUnknown fieldID = iota
	fType
	fBlockHashes
	fParentBlockHash
	fTokenIDs
	fBlockSize
	fLoRAID
	fMedium
	fLoRAName
	fExtraKeys
	fGroupIdx
	fKVCacheSpecKind
	fKVCacheSpecSlidingWindow
	fLocality
)

var fieldNames = [...]string{
	fUnknown: "", fType: "type", fBlockHashes: "block_hashes",
	fParentBlockHash: "parent_block_hash", fTokenIDs: "token_ids",
	fBlockSize: "block_size", fLoRAID: "lora_id", fMedium: "medium",
	fLoRAName: "lora_name", fExtraKeys: "extra_keys", fGroupIdx: "group_idx",
	fKVCacheSpecKind:          "kv_cache_spec_kind",
	fKVCacheSpecSlidingWindow: "kv_cache_spec_sliding_window",
	fLocality:                 "locality",
}

// Positional field order of each event type (after the tag), vLLM
// kv_events.py declaration order. Array layouts are prefixes of these.
var (
	storedFields = [...]fieldID{fBlockHashes, fParentBlockHash, fTokenIDs, fBlockSize,
		fLoRAID, fMedium, fLoRAName, fExtraKeys, fGroupIdx, fKVCacheSpecKind,
		fKVCacheSpecSlidingWindow, fLocality}
	removedFields = [...]fieldID{fBlockHashes, fMedium, fGroupIdx, fLocality}
)

func lookupField(key []byte) fieldID {
	switch string(key) {
	case "type":
		return fType
	case "block_hashes":
		return fBlockHashes
	case "parent_block_hash":
		return fParentBlockHash
	case "token_ids":
		return fTokenIDs
	case "block_size":
		return fBlockSize
	case "lora_id":
		return fLoRAID
	case "medium":
		return fMedium
	case "lora_name":
		return fLoRAName
	case "extra_keys":
		return fExtraKeys
	case "group_idx":
		return fGroupIdx
	case "kv_cache_spec_kind":
		return fKVCacheSpecKind
	case "kv_cache_spec_sliding_window":
		return fKVCacheSpecSlidingWindow
	case "locality":
		return fLocality
	}
	return fUnknown
}

// belongs reports whether field f is declared by events of type t.
func belongs(t EventType, f fieldID) bool {
	switch t {
	case BlockStored:
		return f >= fBlockHashes
	case BlockRemoved:
		return f == fBlockHashes || f == fMedium || f == fGroupIdx || f == fLocality
	}
	return false
}

func (p *decoder) mapEvent(e *Event) error {
	n, err := p.mapLen()
	if err != nil {
		return err
	}
	var pending []fieldID // fields seen before "type" (vLLM writes it first)
	for i := 0; i < n; i++ {
		p.field, p.idx = "", -1
		key, err := p.key()
		if err != nil {
			return err
		}
		f := lookupField(key)
		p.field = fieldNames[f]
		switch {
		case f == fType:
			if err := p.tag(e); err != nil {
				return err
			}
			continue
		case f == fUnknown:
			p.field = string(key)
			err = p.skip(0)
		case e.Type == 0:
			// Field before the tag: decode it, drop it below if it does
			// not belong to the type.
			pending = append(pending, f)
			err = p.value(e, f)
		case belongs(e.Type, f):
			err = p.value(e, f)
		default:
			err = p.skip(0)
		}
		if err != nil {
			return err
		}
	}
	p.field, p.idx = "type", -1
	if e.Type == 0 {
		return p.failf("event has no \"type\" key")
	}
	for _, f := range pending {
		if !belongs(e.Type, f) {
			clearField(e, f)
		}
	}
	return nil
}

func (p *decoder) arrayEvent(e *Event) error {
	n, _, err := p.arrayLen()
	if err != nil {
		return err
	}
	p.field = "type"
	if n == 0 {
		return p.failf("event array is empty, want [tag, fields...]")
	}
	if err := p.tag(e); err != nil {
		return err
	}
	var fields []fieldID
	switch e.Type {
	case BlockStored:
		fields = storedFields[:]
	case BlockRemoved:
		fields = removedFields[:]
	}
	for i := 1; i < n; i++ {
		p.idx = -1
		if i-1 < len(fields) {
			f := fields[i-1]
			p.field = fieldNames[f]
			err = p.value(e, f)
		} else {
			p.field = "[" + strconv.Itoa(i) + "]"
			err = p.skip(0)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// tag decodes an event tag into e.Type.
func (p *decoder) tag(e *Event) error {
	b, isNil, err := p.str()
	if err != nil {
		return err
	}
	switch {
	case isNil:
		return p.failf("event tag is nil")
	case string(b) == "BlockStored":
		e.Type = BlockStored
	case string(b) == "BlockRemoved":
		e.Type = BlockRemoved
	case string(b) == "AllBlocksCleared":
		e.Type = AllBlocksCleared
	default:
		return p.failf("unknown event type %q", truncate(b, 40))
	}
	return nil
}

func truncate(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "..."
	}
	return string(b)
}

func clearField(e *Event, f fieldID) {
	switch f {
	case fBlockHashes:
		e.BlockHashes = nil
	case fParentBlockHash:
		e.ParentBlockHash = nil
	case fTokenIDs:
		e.TokenIDs = nil
	case fBlockSize:
		e.BlockSize = 0
	case fLoRAID:
		e.LoRAID = nil
	case fMedium:
		e.Medium = ""
	case fLoRAName:
		e.LoRAName = nil
	case fExtraKeys:
		e.ExtraKeys = nil
	case fGroupIdx:
		e.GroupIdx = nil
	case fKVCacheSpecKind:
		e.KVCacheSpecKind = ""
	case fKVCacheSpecSlidingWindow:
		e.KVCacheSpecSlidingWindow = nil
	case fLocality:
		e.Locality = ""
	}
}

// value decodes field f into e. nil is accepted for every field and leaves
// it zero (msgspec would reject nil for the non-optional ones; tolerating it
// costs nothing and keeps encode/decode round trips exact).
func (p *decoder) value(e *Event, f fieldID) error {
	var err error
	switch f {
	case fBlockHashes:
		e.BlockHashes, err = p.hashes()
	case fParentBlockHash:
		// 0 is no parent, like nil (see Event.ParentBlockHash).
		var h BlockHash
		var ok bool
		if h, ok, err = p.hash(); err == nil && ok && h != 0 {
			e.ParentBlockHash = &h
		}
	case fTokenIDs:
		e.TokenIDs, err = p.tokens()
	case fBlockSize:
		e.BlockSize, _, err = p.smallInt(true)
	case fLoRAID:
		e.LoRAID, err = p.int64Ptr()
	case fMedium:
		e.Medium, _, err = p.enumString()
	case fLoRAName:
		var s string
		var ok bool
		if s, ok, err = p.enumString(); err == nil && ok {
			e.LoRAName = &s
		}
	case fExtraKeys:
		e.ExtraKeys, err = p.extraKeys()
	case fGroupIdx:
		e.GroupIdx, err = p.intPtr()
	case fKVCacheSpecKind:
		e.KVCacheSpecKind, _, err = p.enumString()
	case fKVCacheSpecSlidingWindow:
		e.KVCacheSpecSlidingWindow, err = p.intPtr()
	case fLocality:
		e.Locality, _, err = p.enumString()
	default:
		err = p.skip(0)
	}
	return err
}
