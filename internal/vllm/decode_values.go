package vllm

import (
	"encoding/binary"
	"io"
	"math"

	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// This file holds DecodeBatch's typed readers. Each reader peeks the msgpack
// code first, so a value of the wrong type is reported (the msgpack library
// would silently turn nil into 0) and lengths are checked against the bytes
// left before anything is allocated.

// arrayLen reads an array header; nil is reported as isNil.
func (p *decoder) arrayLen() (n int, isNil bool, err error) {
	c, err := p.peek()
	if err != nil {
		return 0, false, err
	}
	if c == msgpcode.Nil {
		_ = p.d.DecodeNil()
		return 0, true, nil
	}
	if !isArrayCode(c) {
		return 0, false, p.failf("expected array, got %s", codeName(c))
	}
	if n, err = p.d.DecodeArrayLen(); err != nil {
		return 0, false, p.fail(err)
	}
	// Every element takes at least one byte.
	if n > p.br.Len() {
		return 0, false, p.failf("array of %d elements but only %d bytes left: %w", n, p.br.Len(), io.ErrUnexpectedEOF)
	}
	return n, false, nil
}

func (p *decoder) mapLen() (int, error) {
	c, err := p.peek()
	if err != nil {
		return 0, err
	}
	if !isMapCode(c) {
		return 0, p.failf("expected map, got %s", codeName(c))
	}
	n, err := p.d.DecodeMapLen()
	if err != nil {
		return 0, p.fail(err)
	}
	if n > p.br.Len()/2 {
		return 0, p.failf("map of %d entries but only %d bytes left: %w", n, p.br.Len(), io.ErrUnexpectedEOF)
	}
	return n, nil
}

// rawBytes reads a str or bin body of n bytes, into scratch when it fits.
// The result is only valid until the next read.
func (p *decoder) rawBytes() ([]byte, error) {
	n, err := p.d.DecodeBytesLen()
	if err != nil {
		return nil, p.fail(err)
	}
	if n > p.br.Len() {
		return nil, p.failf("%d-byte string but only %d bytes left: %w", n, p.br.Len(), io.ErrUnexpectedEOF)
	}
	var b []byte
	if n <= len(p.scratch) {
		b = p.scratch[:n]
	} else {
		b = make([]byte, n)
	}
	if err := p.d.ReadFull(b); err != nil {
		return nil, p.fail(err)
	}
	return b, nil
}

// str reads a str (or nil). The bytes are valid until the next read.
func (p *decoder) str() (b []byte, isNil bool, err error) {
	c, err := p.peek()
	if err != nil {
		return nil, false, err
	}
	if c == msgpcode.Nil {
		_ = p.d.DecodeNil()
		return nil, true, nil
	}
	if !isStrCode(c) {
		return nil, false, p.failf("expected str, got %s", codeName(c))
	}
	b, err = p.rawBytes()
	return b, false, err
}

// key reads a map key, which must be a str.
func (p *decoder) key() ([]byte, error) {
	b, isNil, err := p.str()
	if err == nil && isNil {
		err = p.failf("map key is nil")
	}
	return b, err
}

// enumString reads a str or nil. Values vLLM repeats in every event are
// returned as constants so they cost no allocation.
func (p *decoder) enumString() (string, bool, error) {
	b, isNil, err := p.str()
	if err != nil || isNil {
		return "", false, err
	}
	switch string(b) {
	case "GPU":
		return "GPU", true, nil
	case "CPU":
		return "CPU", true, nil
	case "STORAGE":
		return "STORAGE", true, nil
	case FullAttention:
		return FullAttention, true, nil
	case "sliding_window":
		return "sliding_window", true, nil
	case "LOCAL":
		return "LOCAL", true, nil
	}
	return string(b), true, nil
}

func (p *decoder) float() (float64, error) {
	c, err := p.peek()
	if err != nil {
		return 0, err
	}
	if c != msgpcode.Float && c != msgpcode.Double && !isUintCode(c) && !isIntCode(c) {
		return 0, p.failf("expected float, got %s", codeName(c))
	}
	if isUintCode(c) {
		u, err := p.d.DecodeUint64()
		if err != nil {
			return 0, p.fail(err)
		}
		return float64(u), nil
	}
	f, err := p.d.DecodeFloat64()
	if err != nil {
		return 0, p.fail(err)
	}
	return f, nil
}

// integer reads any msgpack int. neg reports a negative value, in which case
// v holds its two's-complement bits.
func (p *decoder) integer(c byte) (v uint64, neg bool, err error) {
	if isUintCode(c) {
		v, err = p.d.DecodeUint64()
	} else {
		var i int64
		i, err = p.d.DecodeInt64()
		v, neg = uint64(i), i < 0
	}
	if err != nil {
		return 0, false, p.fail(err)
	}
	return v, neg, nil
}

// smallInt reads an int in [0, MaxInt32] (a size, index or rank), or nil
// when nilOK. ok is false for nil.
func (p *decoder) smallInt(nilOK bool) (int, bool, error) {
	c, err := p.peek()
	if err != nil {
		return 0, false, err
	}
	if c == msgpcode.Nil && nilOK {
		_ = p.d.DecodeNil()
		return 0, false, nil
	}
	if !isUintCode(c) && !isIntCode(c) {
		return 0, false, p.failf("expected int, got %s", codeName(c))
	}
	v, neg, err := p.integer(c)
	if err != nil {
		return 0, false, err
	}
	if neg || v > math.MaxInt32 {
		return 0, false, p.failf("%s out of range [0, %d]", intString(v, neg), math.MaxInt32)
	}
	return int(v), true, nil
}

func (p *decoder) intPtr() (*int, error) {
	v, ok, err := p.smallInt(true)
	if err != nil || !ok {
		return nil, err
	}
	return &v, nil
}

func (p *decoder) int64Ptr() (*int64, error) {
	c, err := p.peek()
	if err != nil {
		return nil, err
	}
	if c == msgpcode.Nil {
		_ = p.d.DecodeNil()
		return nil, nil
	}
	if !isUintCode(c) && !isIntCode(c) {
		return nil, p.failf("expected int, got %s", codeName(c))
	}
	v, neg, err := p.integer(c)
	if err != nil {
		return nil, err
	}
	if !neg && v > math.MaxInt64 {
		return nil, p.failf("%d out of int64 range", v)
	}
	i := int64(v)
	return &i, nil
}

// hash reads one block hash: an int (uint64, or negative int64 taken as its
// bits) or bin (last 8 bytes big-endian; shorter digests are left-padded).
// ok is false for nil.
func (p *decoder) hash() (BlockHash, bool, error) {
	c, err := p.peek()
	if err != nil {
		return 0, false, err
	}
	switch {
	case c == msgpcode.Nil:
		_ = p.d.DecodeNil()
		return 0, false, nil
	case isUintCode(c) || isIntCode(c):
		v, _, err := p.integer(c)
		return BlockHash(v), err == nil, err
	case isBinCode(c):
		b, err := p.rawBytes()
		if err != nil {
			return 0, false, err
		}
		return EventValue(b), true, nil
	}
	return 0, false, p.failf("expected int or bin hash, got %s", codeName(c))
}

func (p *decoder) hashes() ([]BlockHash, error) {
	n, isNil, err := p.arrayLen()
	if err != nil || isNil {
		return nil, err
	}
	hs := make([]BlockHash, n)
	for i := range hs {
		if v, ok := p.fastUint(); ok {
			hs[i] = BlockHash(v)
			continue
		}
		p.idx = i
		h, ok, err := p.hash()
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, p.failf("block hash is nil")
		}
		hs[i] = h
	}
	p.idx = -1
	return hs, nil
}

func (p *decoder) tokens() ([]uint32, error) {
	n, isNil, err := p.arrayLen()
	if err != nil || isNil {
		return nil, err
	}
	ts := make([]uint32, n)
	for i := range ts {
		start := p.off()
		if v, ok := p.fastUint(); ok {
			if v > math.MaxUint32 {
				p.idx, p.start = i, start
				return nil, p.failf("token id %d out of range [0, 2^32)", v)
			}
			ts[i] = uint32(v)
			continue
		}
		p.idx = i
		c, err := p.peek()
		if err != nil {
			return nil, err
		}
		if !isUintCode(c) && !isIntCode(c) {
			return nil, p.failf("expected int token id, got %s", codeName(c))
		}
		v, neg, err := p.integer(c)
		if err != nil {
			return nil, err
		}
		if neg || v > math.MaxUint32 {
			return nil, p.failf("token id %s out of range [0, 2^32)", intString(v, neg))
		}
		ts[i] = uint32(v)
	}
	p.idx = -1
	return ts, nil
}

// extraKeys reads extra_keys: nil, or one entry per block, each nil or a
// tuple (array) of items.
func (p *decoder) extraKeys() ([][]any, error) {
	n, isNil, err := p.arrayLen()
	if err != nil || isNil {
		return nil, err
	}
	keys := make([][]any, n)
	for i := range keys {
		p.idx = i
		m, isNil, err := p.arrayLen()
		if err != nil {
			return nil, err
		}
		if isNil {
			continue
		}
		tuple := make([]any, m)
		for j := range tuple {
			if tuple[j], err = p.anyValue(1); err != nil {
				return nil, err
			}
		}
		keys[i] = tuple
	}
	p.idx = -1
	return keys, nil
}

// anyValue reads one extra-key item: nil, bool, int64 (uint64 above
// MaxInt64), float64, string, []byte, or []any for a nested tuple. Maps and
// extension types are not Python hashables vLLM puts in extra keys and are
// rejected.
func (p *decoder) anyValue(depth int) (any, error) {
	if depth > maxDepth {
		return nil, p.failf("nesting deeper than %d", maxDepth)
	}
	c, err := p.peek()
	if err != nil {
		return nil, err
	}
	switch {
	case c == msgpcode.Nil:
		_ = p.d.DecodeNil()
		return nil, nil
	case c == msgpcode.False || c == msgpcode.True:
		v, err := p.d.DecodeBool()
		if err != nil {
			return nil, p.fail(err)
		}
		return v, nil
	case isUintCode(c) || isIntCode(c):
		v, neg, err := p.integer(c)
		if err != nil {
			return nil, err
		}
		if !neg && v > math.MaxInt64 {
			return v, nil
		}
		return int64(v), nil
	case c == msgpcode.Float || c == msgpcode.Double:
		return p.float()
	case isStrCode(c):
		b, err := p.rawBytes()
		if err != nil {
			return nil, err
		}
		return string(b), nil
	case isBinCode(c):
		b, err := p.rawBytes()
		if err != nil {
			return nil, err
		}
		return append([]byte{}, b...), nil
	case isArrayCode(c):
		n, _, err := p.arrayLen()
		if err != nil {
			return nil, err
		}
		t := make([]any, n)
		for i := range t {
			if t[i], err = p.anyValue(depth + 1); err != nil {
				return nil, err
			}
		}
		return t, nil
	}
	return nil, p.failf("unsupported extra key item of type %s", codeName(c))
}

// fastUint reads a well-formed unsigned int straight from the payload, the
// common case of token ids and hashes; ok is false (and nothing is consumed)
// for anything else, which the general path then decodes or reports.
func (p *decoder) fastUint() (v uint64, ok bool) {
	b := p.payload[p.off():]
	if len(b) == 0 {
		return 0, false
	}
	n := 0
	switch c := b[0]; {
	case c <= msgpcode.PosFixedNumHigh:
		v, n = uint64(c), 1
	case c == msgpcode.Uint8 && len(b) >= 2:
		v, n = uint64(b[1]), 2
	case c == msgpcode.Uint16 && len(b) >= 3:
		v, n = uint64(binary.BigEndian.Uint16(b[1:])), 3
	case c == msgpcode.Uint32 && len(b) >= 5:
		v, n = uint64(binary.BigEndian.Uint32(b[1:])), 5
	case c == msgpcode.Uint64 && len(b) >= 9:
		v, n = binary.BigEndian.Uint64(b[1:]), 9
	default:
		return 0, false
	}
	_, _ = p.br.Seek(int64(n), io.SeekCurrent)
	return v, true
}
