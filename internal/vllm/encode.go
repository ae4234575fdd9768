package vllm

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
)

// Layout selects how AppendBatch writes events.
type Layout int

const (
	// LayoutMap is vLLM >= 0.24's msgspec map layout (vllm/distributed/
	// kv_events.py, main 2026-08-07): each event a map with "type" first,
	// then the fields in declaration order; fields without a default are
	// always written (nil included), fields defaulting to None are omitted
	// when nil or empty.
	LayoutMap Layout = iota
	// LayoutArray is the positional layout of vLLM v0.22-v0.23: BlockStored
	// [tag, 11 fields], BlockRemoved [tag, block_hashes, medium, group_idx],
	// AllBlocksCleared [tag], every field written, nil included. It has no
	// locality field; AppendBatch refuses events that carry one.
	LayoutArray
)

// String names the layout: "map" or "array".
func (l Layout) String() string {
	switch l {
	case LayoutMap:
		return "map"
	case LayoutArray:
		return "array"
	}
	return fmt.Sprintf("Layout(%d)", int(l))
}

// AppendBatch appends b, msgpack-encoded exactly as vLLM's msgspec encoder
// writes it (smallest int forms, unsigned when >= 0, ts as float64, str8 for
// 32-255 byte strings), to dst and returns the extended slice. For map
// layout the bytes are identical to vLLM's for any Batch vLLM could have
// produced; block hashes are always written as ints (vLLM's default
// VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1). A nil slice field is written as
// nil, an empty one as an empty array, so DecodeBatch(AppendBatch(b)) == b.
// It fails on an unknown event type or layout, an extra-key item of a type
// msgpack cannot carry, or a Locality under LayoutArray. With enough
// capacity in dst it does not allocate.
func AppendBatch(dst []byte, b *Batch, l Layout) ([]byte, error) {
	if l != LayoutMap && l != LayoutArray {
		return dst, fmt.Errorf("encode batch: unknown layout %d", int(l))
	}
	dst = slices.Grow(dst, batchSizeHint(b))
	dst = append(dst, 0x93, 0xcb)
	dst = binary.BigEndian.AppendUint64(dst, math.Float64bits(b.TS))
	dst = appendArrayLen(dst, len(b.Events))
	var err error
	for i := range b.Events {
		e := &b.Events[i]
		if l == LayoutMap {
			dst, err = appendMapEvent(dst, e)
		} else {
			dst, err = appendArrayEvent(dst, e)
		}
		if err != nil {
			return dst, fmt.Errorf("encode events[%d]: %w", i, err)
		}
	}
	return appendInt(dst, int64(b.DataParallelRank)), nil
}

// batchSizeHint is an upper-bound guess of the encoded size, so dst grows
// once.
func batchSizeHint(b *Batch) int {
	n := 16
	for i := range b.Events {
		e := &b.Events[i]
		n += 256 + 9*len(e.BlockHashes) + 5*len(e.TokenIDs) + 4*len(e.ExtraKeys)
	}
	return n
}

// Map keys and tags, pre-encoded as msgpack fixstr (0xa0 | length).
const (
	keyType           = "\xa4type"
	keyBlockHashes    = "\xacblock_hashes"
	keyParent         = "\xb1parent_block_hash"
	keyTokenIDs       = "\xa9token_ids"
	keyBlockSize      = "\xaablock_size"
	keyLoRAID         = "\xa7lora_id"
	keyMedium         = "\xa6medium"
	keyLoRAName       = "\xa9lora_name"
	keyExtraKeys      = "\xaaextra_keys"
	keyGroupIdx       = "\xa9group_idx"
	keySpecKind       = "\xb2kv_cache_spec_kind"
	keySlidingWindow  = "\xbckv_cache_spec_sliding_window"
	keyLocality       = "\xa8locality"
	tagBlockStored    = "\xabBlockStored"
	tagBlockRemoved   = "\xacBlockRemoved"
	tagAllBlocksClear = "\xb0AllBlocksCleared"
)

func appendMapEvent(dst []byte, e *Event) ([]byte, error) {
	switch e.Type {
	case BlockStored:
		n := 8
		for _, set := range [...]bool{e.ExtraKeys != nil, e.GroupIdx != nil, e.KVCacheSpecKind != "",
			e.KVCacheSpecSlidingWindow != nil, e.Locality != ""} {
			if set {
				n++
			}
		}
		dst = appendMapLen(dst, n)
		dst = append(dst, keyType...)
		dst = append(dst, tagBlockStored...)
		dst = append(dst, keyBlockHashes...)
		dst = appendHashes(dst, e.BlockHashes)
		dst = append(dst, keyParent...)
		dst = appendHashPtr(dst, e.ParentBlockHash)
		dst = append(dst, keyTokenIDs...)
		dst = appendTokens(dst, e.TokenIDs)
		dst = append(dst, keyBlockSize...)
		dst = appendInt(dst, int64(e.BlockSize))
		dst = append(dst, keyLoRAID...)
		dst = appendInt64Ptr(dst, e.LoRAID)
		dst = append(dst, keyMedium...)
		dst = appendOptStr(dst, e.Medium)
		dst = append(dst, keyLoRAName...)
		dst = appendStrPtr(dst, e.LoRAName)
		if e.ExtraKeys != nil {
			var err error
			dst = append(dst, keyExtraKeys...)
			if dst, err = appendEventExtraKeys(dst, e.ExtraKeys); err != nil {
				return dst, err
			}
		}
		if e.GroupIdx != nil {
			dst = append(dst, keyGroupIdx...)
			dst = appendInt(dst, int64(*e.GroupIdx))
		}
		if e.KVCacheSpecKind != "" {
			dst = append(dst, keySpecKind...)
			dst = appendStr(dst, e.KVCacheSpecKind)
		}
		if e.KVCacheSpecSlidingWindow != nil {
			dst = append(dst, keySlidingWindow...)
			dst = appendInt(dst, int64(*e.KVCacheSpecSlidingWindow))
		}
		if e.Locality != "" {
			dst = append(dst, keyLocality...)
			dst = appendStr(dst, e.Locality)
		}
	case BlockRemoved:
		n := 3
		if e.GroupIdx != nil {
			n++
		}
		if e.Locality != "" {
			n++
		}
		dst = appendMapLen(dst, n)
		dst = append(dst, keyType...)
		dst = append(dst, tagBlockRemoved...)
		dst = append(dst, keyBlockHashes...)
		dst = appendHashes(dst, e.BlockHashes)
		dst = append(dst, keyMedium...)
		dst = appendOptStr(dst, e.Medium)
		if e.GroupIdx != nil {
			dst = append(dst, keyGroupIdx...)
			dst = appendInt(dst, int64(*e.GroupIdx))
		}
		if e.Locality != "" {
			dst = append(dst, keyLocality...)
			dst = appendStr(dst, e.Locality)
		}
	case AllBlocksCleared:
		dst = appendMapLen(dst, 1)
		dst = append(dst, keyType...)
		dst = append(dst, tagAllBlocksClear...)
	default:
		return dst, fmt.Errorf("unknown event type %v", e.Type)
	}
	return dst, nil
}

func appendArrayEvent(dst []byte, e *Event) ([]byte, error) {
	if e.Locality != "" {
		return dst, fmt.Errorf("locality %q cannot be written in the array layout", e.Locality)
	}
	switch e.Type {
	case BlockStored:
		dst = append(dst, 0x9c) // tag + 11 fields
		dst = append(dst, tagBlockStored...)
		dst = appendHashes(dst, e.BlockHashes)
		dst = appendHashPtr(dst, e.ParentBlockHash)
		dst = appendTokens(dst, e.TokenIDs)
		dst = appendInt(dst, int64(e.BlockSize))
		dst = appendInt64Ptr(dst, e.LoRAID)
		dst = appendOptStr(dst, e.Medium)
		dst = appendStrPtr(dst, e.LoRAName)
		if e.ExtraKeys == nil {
			dst = append(dst, 0xc0)
		} else {
			var err error
			if dst, err = appendEventExtraKeys(dst, e.ExtraKeys); err != nil {
				return dst, err
			}
		}
		dst = appendIntPtr(dst, e.GroupIdx)
		dst = appendOptStr(dst, e.KVCacheSpecKind)
		dst = appendIntPtr(dst, e.KVCacheSpecSlidingWindow)
	case BlockRemoved:
		dst = append(dst, 0x94)
		dst = append(dst, tagBlockRemoved...)
		dst = appendHashes(dst, e.BlockHashes)
		dst = appendOptStr(dst, e.Medium)
		dst = appendIntPtr(dst, e.GroupIdx)
	case AllBlocksCleared:
		dst = append(dst, 0x91)
		dst = append(dst, tagAllBlocksClear...)
	default:
		return dst, fmt.Errorf("unknown event type %v", e.Type)
	}
	return dst, nil
}

func appendHashes(dst []byte, hs []BlockHash) []byte {
	if hs == nil {
		return append(dst, 0xc0)
	}
	dst = appendArrayLen(dst, len(hs))
	for _, h := range hs {
		dst = appendUint(dst, uint64(h))
	}
	return dst
}

func appendHashPtr(dst []byte, h *BlockHash) []byte {
	if h == nil {
		return append(dst, 0xc0)
	}
	return appendUint(dst, uint64(*h))
}

func appendTokens(dst []byte, ts []uint32) []byte {
	if ts == nil {
		return append(dst, 0xc0)
	}
	dst = appendArrayLen(dst, len(ts))
	for _, t := range ts {
		dst = appendUint(dst, uint64(t))
	}
	return dst
}

func appendEventExtraKeys(dst []byte, keys [][]any) ([]byte, error) {
	dst = appendArrayLen(dst, len(keys))
	var err error
	for i, k := range keys {
		if k == nil {
			dst = append(dst, 0xc0)
			continue
		}
		if dst, err = appendAny(dst, k, 0); err != nil {
			return dst, fmt.Errorf("extra_keys[%d]: %w", i, err)
		}
	}
	return dst, nil
}

// appendAny writes one extra-key item: nil, bool, any Go integer, float64,
// string, []byte, or []any (a tuple).
func appendAny(dst []byte, v any, depth int) ([]byte, error) {
	if depth > maxDepth {
		return dst, fmt.Errorf("nesting deeper than %d", maxDepth)
	}
	switch x := v.(type) {
	case nil:
		return append(dst, 0xc0), nil
	case bool:
		if x {
			return append(dst, 0xc3), nil
		}
		return append(dst, 0xc2), nil
	case int:
		return appendInt(dst, int64(x)), nil
	case int32:
		return appendInt(dst, int64(x)), nil
	case int64:
		return appendInt(dst, x), nil
	case uint32:
		return appendUint(dst, uint64(x)), nil
	case uint64:
		return appendUint(dst, x), nil
	case float64:
		dst = append(dst, 0xcb)
		return binary.BigEndian.AppendUint64(dst, math.Float64bits(x)), nil
	case string:
		return appendStr(dst, x), nil
	case []byte:
		return appendBin(dst, x), nil
	case []any:
		dst = appendArrayLen(dst, len(x))
		var err error
		for _, e := range x {
			if dst, err = appendAny(dst, e, depth+1); err != nil {
				return dst, err
			}
		}
		return dst, nil
	}
	return dst, fmt.Errorf("unsupported extra key item of type %T", v)
}

func appendOptStr(dst []byte, s string) []byte {
	if s == "" {
		return append(dst, 0xc0)
	}
	return appendStr(dst, s)
}

func appendStrPtr(dst []byte, s *string) []byte {
	if s == nil {
		return append(dst, 0xc0)
	}
	return appendStr(dst, *s)
}

func appendIntPtr(dst []byte, v *int) []byte {
	if v == nil {
		return append(dst, 0xc0)
	}
	return appendInt(dst, int64(*v))
}

func appendInt64Ptr(dst []byte, v *int64) []byte {
	if v == nil {
		return append(dst, 0xc0)
	}
	return appendInt(dst, *v)
}

// appendUint writes v in the smallest unsigned form.
func appendUint(dst []byte, v uint64) []byte {
	switch {
	case v < 0x80:
		return append(dst, byte(v))
	case v <= math.MaxUint8:
		return append(dst, 0xcc, byte(v))
	case v <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(dst, 0xcd), uint16(v))
	case v <= math.MaxUint32:
		return binary.BigEndian.AppendUint32(append(dst, 0xce), uint32(v))
	}
	return binary.BigEndian.AppendUint64(append(dst, 0xcf), v)
}

// appendInt writes v in the smallest form, unsigned when v >= 0 (msgspec).
func appendInt(dst []byte, v int64) []byte {
	switch {
	case v >= 0:
		return appendUint(dst, uint64(v))
	case v >= -32:
		return append(dst, byte(v))
	case v >= math.MinInt8:
		return append(dst, 0xd0, byte(v))
	case v >= math.MinInt16:
		return binary.BigEndian.AppendUint16(append(dst, 0xd1), uint16(v))
	case v >= math.MinInt32:
		return binary.BigEndian.AppendUint32(append(dst, 0xd2), uint32(v))
	}
	return binary.BigEndian.AppendUint64(append(dst, 0xd3), uint64(v))
}

func appendStr(dst []byte, s string) []byte {
	n := len(s)
	switch {
	case n < 32:
		dst = append(dst, 0xa0|byte(n))
	case n <= math.MaxUint8:
		dst = append(dst, 0xd9, byte(n))
	case n <= math.MaxUint16:
		dst = binary.BigEndian.AppendUint16(append(dst, 0xda), uint16(n))
	default:
		dst = binary.BigEndian.AppendUint32(append(dst, 0xdb), uint32(n))
	}
	return append(dst, s...)
}

func appendBin(dst []byte, b []byte) []byte {
	n := len(b)
	switch {
	case n <= math.MaxUint8:
		dst = append(dst, 0xc4, byte(n))
	case n <= math.MaxUint16:
		dst = binary.BigEndian.AppendUint16(append(dst, 0xc5), uint16(n))
	default:
		dst = binary.BigEndian.AppendUint32(append(dst, 0xc6), uint32(n))
	}
	return append(dst, b...)
}

func appendArrayLen(dst []byte, n int) []byte {
	switch {
	case n < 16:
		return append(dst, 0x90|byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(dst, 0xdc), uint16(n))
	}
	return binary.BigEndian.AppendUint32(append(dst, 0xdd), uint32(n))
}

func appendMapLen(dst []byte, n int) []byte {
	switch {
	case n < 16:
		return append(dst, 0x80|byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(dst, 0xde), uint16(n))
	}
	return binary.BigEndian.AppendUint32(append(dst, 0xdf), uint32(n))
}
