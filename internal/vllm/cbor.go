package vllm

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/fxamacker/cbor/v2"
)

// This file is an append-style CBOR writer for the values vLLM hashes with
// --prefix-caching-hash-algo sha256_cbor or xxhash_cbor:
// cbor2.dumps((parent, tuple(token_ids), extra_keys), canonical=True)
// (vllm/utils/hashing.py). Canonical (RFC 8949 core deterministic)
// encoding of ints, byte and text strings, arrays, null and booleans is
// fixed: shortest-form heads. Floats, which vLLM never puts in extra keys,
// are delegated to fxamacker/cbor's CanonicalEncOptions (shortest float
// that keeps the value). Tests check every golden case and random values
// against fxamacker/cbor.

// appendCBORHead writes a major type and argument in the shortest form.
func appendCBORHead(dst []byte, major byte, v uint64) []byte {
	m := major << 5
	switch {
	case v < 24:
		return append(dst, m|byte(v))
	case v <= math.MaxUint8:
		return append(dst, m|24, byte(v))
	case v <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(dst, m|25), uint16(v))
	case v <= math.MaxUint32:
		return binary.BigEndian.AppendUint32(append(dst, m|26), uint32(v))
	}
	return binary.BigEndian.AppendUint64(append(dst, m|27), v)
}

func appendCBORInt(dst []byte, v int64) []byte {
	if v >= 0 {
		return appendCBORHead(dst, 0, uint64(v))
	}
	return appendCBORHead(dst, 1, uint64(-(v + 1)))
}

// appendCBORAny writes one extra-key item (see Event.ExtraKeys for types).
func appendCBORAny(dst []byte, v any, em cbor.EncMode, depth int) ([]byte, error) {
	if depth > maxDepth {
		return dst, fmt.Errorf("extra keys nested deeper than %d", maxDepth)
	}
	switch x := v.(type) {
	case nil:
		return append(dst, 0xf6), nil
	case bool:
		if x {
			return append(dst, 0xf5), nil
		}
		return append(dst, 0xf4), nil
	case int:
		return appendCBORInt(dst, int64(x)), nil
	case int32:
		return appendCBORInt(dst, int64(x)), nil
	case int64:
		return appendCBORInt(dst, x), nil
	case uint32:
		return appendCBORHead(dst, 0, uint64(x)), nil
	case uint64:
		return appendCBORHead(dst, 0, x), nil
	case float64:
		b, err := em.Marshal(x)
		if err != nil {
			return dst, fmt.Errorf("encode float %v: %w", x, err)
		}
		return append(dst, b...), nil
	case string:
		return append(appendCBORHead(dst, 3, uint64(len(x))), x...), nil
	case []byte:
		return append(appendCBORHead(dst, 2, uint64(len(x))), x...), nil
	case []any:
		return appendCBORArray(dst, x, em, depth)
	}
	return dst, fmt.Errorf("unsupported extra key item of type %T", v)
}

// appendCBORArray writes items as a CBOR array (a Python tuple).
func appendCBORArray(dst []byte, items []any, em cbor.EncMode, depth int) ([]byte, error) {
	dst = appendCBORHead(dst, 4, uint64(len(items)))
	var err error
	for _, e := range items {
		if dst, err = appendCBORAny(dst, e, em, depth+1); err != nil {
			return dst, err
		}
	}
	return dst, nil
}
