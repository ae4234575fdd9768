package vllm

import (
	"encoding/binary"
	"io"
	"strconv"

	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// msgpack code classes, and skipping values DecodeBatch does not keep.

func isMapCode(c byte) bool {
	return msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32
}

func isArrayCode(c byte) bool {
	return msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32
}

func isStrCode(c byte) bool {
	return msgpcode.IsFixedString(c) || c == msgpcode.Str8 || c == msgpcode.Str16 || c == msgpcode.Str32
}

func isBinCode(c byte) bool {
	return c == msgpcode.Bin8 || c == msgpcode.Bin16 || c == msgpcode.Bin32
}

// isUintCode: non-negative fixint or uint8..uint64.
func isUintCode(c byte) bool {
	return msgpcode.IsFixedNum(c) && c <= msgpcode.PosFixedNumHigh ||
		c == msgpcode.Uint8 || c == msgpcode.Uint16 || c == msgpcode.Uint32 || c == msgpcode.Uint64
}

// isIntCode: negative fixint or int8..int64 (whose value may still be >= 0).
func isIntCode(c byte) bool {
	return c >= msgpcode.NegFixedNumLow ||
		c == msgpcode.Int8 || c == msgpcode.Int16 || c == msgpcode.Int32 || c == msgpcode.Int64
}

func isExtCode(c byte) bool {
	return c >= msgpcode.FixExt1 && c <= msgpcode.FixExt16 || c >= msgpcode.Ext8 && c <= msgpcode.Ext32
}

// codeName names a msgpack code's type for error messages.
func codeName(c byte) string {
	switch {
	case c == msgpcode.Nil:
		return "nil"
	case c == msgpcode.False || c == msgpcode.True:
		return "bool"
	case isUintCode(c) || isIntCode(c):
		return "int"
	case c == msgpcode.Float || c == msgpcode.Double:
		return "float"
	case isStrCode(c):
		return "str"
	case isBinCode(c):
		return "bin"
	case isArrayCode(c):
		return "array"
	case isMapCode(c):
		return "map"
	case isExtCode(c):
		return "ext"
	}
	return "invalid code 0xc1"
}

// skip skips one value of any type, bounding nesting depth and checking
// every length against the bytes left.
func (p *decoder) skip(depth int) error {
	if depth > maxDepth {
		return p.failf("nesting deeper than %d", maxDepth)
	}
	c, err := p.peek()
	if err != nil {
		return err
	}
	switch {
	case isArrayCode(c):
		n, _, err := p.arrayLen()
		for i := 0; err == nil && i < n; i++ {
			err = p.skip(depth + 1)
		}
		return err
	case isMapCode(c):
		n, err := p.mapLen()
		for i := 0; err == nil && i < 2*n; i++ {
			err = p.skip(depth + 1)
		}
		return err
	case isStrCode(c) || isBinCode(c):
		n, err := p.d.DecodeBytesLen()
		if err != nil {
			return p.fail(err)
		}
		return p.seek(n)
	case isExtCode(c):
		return p.skipExt(c)
	case c == 0xc1:
		return p.failf("invalid msgpack code 0xc1")
	}
	if err := p.d.Skip(); err != nil {
		return p.fail(err)
	}
	return nil
}

// seek advances n bytes, failing if fewer are left.
func (p *decoder) seek(n int) error {
	if n > p.br.Len() {
		return p.failf("%d-byte value but only %d bytes left: %w", n, p.br.Len(), io.ErrUnexpectedEOF)
	}
	_, _ = p.br.Seek(int64(n), io.SeekCurrent)
	return nil
}

func (p *decoder) skipExt(c byte) error {
	_, _ = p.br.ReadByte() // the code, already peeked
	var n int
	switch c {
	case msgpcode.FixExt1, msgpcode.FixExt2, msgpcode.FixExt4, msgpcode.FixExt8, msgpcode.FixExt16:
		n = 1 << (c - msgpcode.FixExt1)
	default:
		w := 1 << (c - msgpcode.Ext8) // length field width: 1, 2 or 4
		var lb [4]byte
		if _, err := io.ReadFull(&p.br, lb[4-w:]); err != nil {
			return p.fail(err)
		}
		n = int(binary.BigEndian.Uint32(lb[:]))
	}
	return p.seek(n + 1) // type byte + data
}

// intString formats an integer read by integer().
func intString(v uint64, neg bool) string {
	if neg {
		return strconv.FormatInt(int64(v), 10)
	}
	return strconv.FormatUint(v, 10)
}
