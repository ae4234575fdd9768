package vllm

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"
	"unicode/utf8"
)

// This file is a Python pickle protocol 5 writer for exactly the values vLLM
// hashes with --prefix-caching-hash-algo sha256 (the default) or xxhash:
// pickle.dumps((parent_hash_bytes, tuple(token_ids), extra_keys), protocol=5)
// (vllm/utils/hashing.py), and the PYTHONHASHSEED string for NONE_HASH. It
// reproduces CPython's C pickler (_pickle.c, identical on 3.10-3.13):
// framing, memoisation and the smallest int opcodes.
//
// Memoisation caveat: pickle memoises by object identity, so the same Python
// object appearing twice in one pickled tuple is written once and then
// referenced (BINGET). Identity is invisible from outside the engine. This
// writer models the one case CPython makes deterministic: strings of one
// Latin-1 character and the empty string are interned singletons, so a
// repeat of one of them is a BINGET. Every other repeated string (e.g. the
// same multimodal identifier twice in one block, if vLLM happened to reuse
// the object) is written again, which may differ from the engine. The CBOR
// algorithms have no such ambiguity; prefer them for hash diagnostics.

// Pickle opcodes used here (Lib/pickletools.py).
const (
	pkProto           = 0x80
	pkFrame           = 0x95
	pkStop            = '.'
	pkMark            = '('
	pkTuple           = 't'
	pkEmptyTuple      = ')'
	pkTuple1          = 0x85
	pkTuple2          = 0x86
	pkTuple3          = 0x87
	pkMemoize         = 0x94
	pkBinGet          = 'h'
	pkLongBinGet      = 'j'
	pkNone            = 'N'
	pkNewTrue         = 0x88
	pkNewFalse        = 0x89
	pkBinInt1         = 'K'
	pkBinInt2         = 'M'
	pkBinInt          = 'J'
	pkLong1           = 0x8a
	pkBinFloat        = 'G'
	pkShortBinBytes   = 'C'
	pkBinBytes        = 'B'
	pkBinBytes8       = 0x8e
	pkShortBinUni     = 0x8c
	pkBinUnicode      = 'X'
	pkBinUnicode8     = 0x8d
	pkFrameHeader     = 9
	pkFrameSizeMin    = 4
	pkFrameSizeTarget = 64 * 1024
)

// pickler writes one pickle at a time into a reused buffer. Not safe for
// concurrent use.
type pickler struct {
	buf        []byte
	frameStart int // offset of the open frame's header, -1 when none
	memo       uint32
	// singletons[c] is the memo index+1 of the interned 1-char string
	// with code point c (256: the empty string) in the current pickle, 0
	// when not yet written; gen tells stale entries apart.
	gen        uint32
	singletons [257]struct{ gen, idx uint32 }
}

// begin starts a pickle in buf, reusing its storage.
func (p *pickler) begin() {
	p.buf = append(p.buf[:0], pkProto, 5)
	p.frameStart = -1
	p.memo = 0
	p.gen++
	if p.gen == 0 { // wrapped: clear, since gen 0 entries would look current
		p.singletons = [257]struct{ gen, idx uint32 }{}
		p.gen = 1
	}
}

// end writes STOP, closes the last frame and returns the pickle, valid until
// the next begin.
func (p *pickler) end() []byte {
	p.write(pkStop)
	p.commitFrame()
	return p.buf
}

// ensureFrame opens a frame if none is open (CPython _Pickler_Write).
func (p *pickler) ensureFrame() {
	if p.frameStart < 0 {
		p.frameStart = len(p.buf)
		p.buf = append(p.buf, make([]byte, pkFrameHeader)...)
	}
}

func (p *pickler) write(b ...byte) {
	p.ensureFrame()
	p.buf = append(p.buf, b...)
}

// commitFrame writes the open frame's header, or drops it when the frame is
// shorter than 4 bytes (CPython _Pickler_CommitFrame).
func (p *pickler) commitFrame() {
	if p.frameStart < 0 {
		return
	}
	n := len(p.buf) - p.frameStart - pkFrameHeader
	if n >= pkFrameSizeMin {
		p.buf[p.frameStart] = pkFrame
		binary.LittleEndian.PutUint64(p.buf[p.frameStart+1:], uint64(n))
	} else {
		copy(p.buf[p.frameStart:], p.buf[p.frameStart+pkFrameHeader:])
		p.buf = p.buf[:len(p.buf)-pkFrameHeader]
	}
	p.frameStart = -1
}

// boundary is called before each object is saved: a frame that reached
// 64 KiB is closed (pickle.py Pickler.save -> framer.commit_frame).
func (p *pickler) boundary() {
	if p.frameStart >= 0 && len(p.buf)-p.frameStart-pkFrameHeader >= pkFrameSizeTarget {
		p.commitFrame()
	}
}

func (p *pickler) memoize() {
	p.write(pkMemoize)
	p.memo++
}

func (p *pickler) none() {
	p.boundary()
	p.write(pkNone)
}

func (p *pickler) bool(v bool) {
	p.boundary()
	if v {
		p.write(pkNewTrue)
	} else {
		p.write(pkNewFalse)
	}
}

func (p *pickler) float(v float64) {
	p.boundary()
	p.ensureFrame()
	p.buf = binary.BigEndian.AppendUint64(append(p.buf, pkBinFloat), math.Float64bits(v))
}

// int writes a Python int: BININT1/BININT2/BININT when it fits in int32,
// else LONG1 with the minimal two's-complement little-endian bytes.
func (p *pickler) int(v int64) {
	p.boundary()
	p.ensureFrame()
	switch {
	case v >= 0 && v <= math.MaxUint8:
		p.buf = append(p.buf, pkBinInt1, byte(v))
	case v >= 0 && v <= math.MaxUint16:
		p.buf = append(p.buf, pkBinInt2, byte(v), byte(v>>8))
	case v >= math.MinInt32 && v <= math.MaxInt32:
		p.buf = binary.LittleEndian.AppendUint32(append(p.buf, pkBinInt), uint32(int32(v)))
	default:
		p.long(uint64(v), v < 0)
	}
}

// uint writes a non-negative Python int.
func (p *pickler) uint(v uint64) {
	if v <= math.MaxInt64 {
		p.int(int64(v))
		return
	}
	p.boundary()
	p.ensureFrame()
	p.long(v, false)
}

// long writes LONG1 for a value outside int32: v holds the two's-complement
// bits when neg. Python's encode_long uses bit_length//8 + 1 bytes, then drops
// a redundant 0xff sign byte of a negative value.
func (p *pickler) long(v uint64, neg bool) {
	mag := v
	if neg {
		mag = -v // |v| as uint64, also right for MinInt64
	}
	n := bits.Len64(mag)/8 + 1
	var b [9]byte
	binary.LittleEndian.PutUint64(b[:8], v)
	if neg {
		b[8] = 0xff
		if n > 1 && b[n-1] == 0xff && b[n-2]&0x80 != 0 {
			n--
		}
	}
	p.buf = append(append(p.buf, pkLong1, byte(n)), b[:n]...)
}

// bytesObj writes a Python bytes object and memoises it.
func (p *pickler) bytesObj(b []byte) {
	p.boundary()
	n := uint64(len(b))
	var hdr [9]byte
	var h []byte
	switch {
	case n <= math.MaxUint8:
		h = append(hdr[:0], pkShortBinBytes, byte(n))
	case n <= math.MaxUint32:
		h = binary.LittleEndian.AppendUint32(append(hdr[:0], pkBinBytes), uint32(n))
	default:
		h = binary.LittleEndian.AppendUint64(append(hdr[:0], pkBinBytes8), n)
	}
	payload(p, h, b)
	p.memoize()
}

// str writes a Python str (as UTF-8) and memoises it, or references the
// earlier copy of an interned singleton.
func (p *pickler) str(s string) {
	p.boundary()
	single := -1
	if s == "" {
		single = 256
	} else if r, size := utf8.DecodeRuneInString(s); size == len(s) && r < 256 && r != utf8.RuneError {
		single = int(r)
	}
	if single >= 0 {
		e := &p.singletons[single]
		if e.gen == p.gen {
			p.binGet(e.idx)
			return
		}
		e.gen, e.idx = p.gen, p.memo
	}
	n := uint64(len(s))
	var hdr [9]byte
	var h []byte
	switch {
	case n <= math.MaxUint8:
		h = append(hdr[:0], pkShortBinUni, byte(n))
	case n <= math.MaxUint32:
		h = binary.LittleEndian.AppendUint32(append(hdr[:0], pkBinUnicode), uint32(n))
	default:
		h = binary.LittleEndian.AppendUint64(append(hdr[:0], pkBinUnicode8), n)
	}
	payload(p, h, s)
	p.memoize()
}

func (p *pickler) binGet(idx uint32) {
	p.ensureFrame()
	if idx <= math.MaxUint8 {
		p.buf = append(p.buf, pkBinGet, byte(idx))
	} else {
		p.buf = binary.LittleEndian.AppendUint32(append(p.buf, pkLongBinGet), idx)
	}
}

// payload writes a bytes/str opcode header and its data. Data of 64 KiB or
// more goes outside any frame, after closing the current one (CPython
// _Pickler_write_bytes).
func payload[T string | []byte](p *pickler, hdr []byte, data T) {
	if len(data) >= pkFrameSizeTarget {
		p.commitFrame()
		p.buf = append(append(p.buf, hdr...), data...)
		return
	}
	p.ensureFrame()
	p.buf = append(append(p.buf, hdr...), data...)
}

// tupleBegin starts a tuple of n elements; tupleEnd(n) closes it.
func (p *pickler) tupleBegin(n int) {
	p.boundary()
	if n > 3 {
		p.write(pkMark)
	}
}

func (p *pickler) tupleEnd(n int) {
	switch n {
	case 0:
		p.write(pkEmptyTuple) // the empty tuple is a singleton, not memoised
		return
	case 1:
		p.write(pkTuple1)
	case 2:
		p.write(pkTuple2)
	case 3:
		p.write(pkTuple3)
	default:
		p.write(pkTuple)
	}
	p.memoize()
}

// any writes one extra-key item (see Event.ExtraKeys for the types).
func (p *pickler) any(v any, depth int) error {
	if depth > maxDepth {
		return fmt.Errorf("extra keys nested deeper than %d", maxDepth)
	}
	switch x := v.(type) {
	case nil:
		p.none()
	case bool:
		p.bool(x)
	case int:
		p.int(int64(x))
	case int32:
		p.int(int64(x))
	case int64:
		p.int(x)
	case uint32:
		p.int(int64(x))
	case uint64:
		p.uint(x)
	case float64:
		p.float(x)
	case string:
		p.str(x)
	case []byte:
		p.bytesObj(x)
	case []any:
		return p.tuple(x, depth)
	default:
		return fmt.Errorf("unsupported extra key item of type %T", v)
	}
	return nil
}

// tuple writes items as a Python tuple.
func (p *pickler) tuple(items []any, depth int) error {
	p.tupleBegin(len(items))
	for _, e := range items {
		if err := p.any(e, depth+1); err != nil {
			return err
		}
	}
	p.tupleEnd(len(items))
	return nil
}

// tokens writes the elements of a token-id tuple. When the open frame cannot
// reach 64 KiB within them (5 bytes per id at most), the per-object frame
// check is skipped.
func (p *pickler) tokens(ts []uint32) {
	p.ensureFrame()
	if len(p.buf)-p.frameStart-pkFrameHeader+5*len(ts) >= pkFrameSizeTarget {
		for _, t := range ts {
			p.int(int64(t))
		}
		return
	}
	b := p.buf
	for _, t := range ts {
		switch {
		case t <= math.MaxUint8:
			b = append(b, pkBinInt1, byte(t))
		case t <= math.MaxUint16:
			b = append(b, pkBinInt2, byte(t), byte(t>>8))
		case t <= math.MaxInt32:
			b = binary.LittleEndian.AppendUint32(append(b, pkBinInt), t)
		default:
			b = append(b, pkLong1, 5, byte(t), byte(t>>8), byte(t>>16), byte(t>>24), 0)
		}
	}
	p.buf = b
}
