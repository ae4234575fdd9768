package tokenizer

import (
	"math/bits"
	"sync"
	"unicode/utf8"
)

// Tokenizer encodes and decodes text exactly like the Hugging Face
// tokenizer it was loaded from. It is safe for concurrent use.
type Tokenizer struct {
	cfg  Config
	norm normalizer // nil: none
	pre  pipeline
	// scanDigits is pre's maxDigits (pipeline.cl100kDigits): when not 0,
	// encodePiece scans and encodes in one pass.
	scanDigits int
	model      *bpe
	added      *addedVocab
	post       post
	// dec.at(id) is what Decode emits for id (see buildDecodeTable).
	dec  byteTable
	pool sync.Pool // *scratch
}

// Config returns the tokenizer_config.json facts (zero if the file was
// absent).
func (t *Tokenizer) Config() Config { return t.cfg }

// Encode returns the token ids of text. addSpecialTokens applies the
// post-processor's special tokens (e.g. Llama-3's <|begin_of_text|>), as
// Hugging Face's encode(text, add_special_tokens) does. Added tokens
// written literally in text (such as "<|im_start|>") always encode as
// their own id. Invalid UTF-8 bytes are replaced by U+FFFD first, one per
// byte. Encode never fails.
func (t *Tokenizer) Encode(text string, addSpecialTokens bool) []uint32 {
	text = validUTF8(text)
	sc, _ := t.pool.Get().(*scratch)
	if sc == nil {
		sc = &scratch{}
	}
	ids := make([]uint32, 0, len(text)/4+8)
	if addSpecialTokens {
		ids = append(ids, t.post.prefix...)
	}
	var outer []segment
	outer = t.added.raw.split(outer, text)
	for _, seg := range outer {
		ids = t.encodeSegment(ids, text, seg, sc)
	}
	if addSpecialTokens {
		ids = append(ids, t.post.suffix...)
	}
	sc.front.reset()
	t.pool.Put(sc)
	return ids
}

// encodeSegment appends the ids of one segment of text (added.raw.split):
// its added token, or its text normalized, split on normalized added
// tokens and encoded. A segment's ids depend on its text alone.
func (t *Tokenizer) encodeSegment(ids []uint32, text string, seg segment, sc *scratch) []uint32 {
	if seg.id >= 0 {
		return append(ids, uint32(seg.id))
	}
	piece := text[seg.start:seg.end]
	if t.norm != nil {
		piece = t.norm.normalize(piece)
	}
	if t.added.normalized.empty() {
		return t.encodePiece(ids, piece, sc)
	}
	for _, inner := range t.added.normalized.split(nil, piece) {
		if inner.id >= 0 {
			ids = append(ids, uint32(inner.id))
			continue
		}
		ids = t.encodePiece(ids, piece[inner.start:inner.end], sc)
	}
	return ids
}

// encodePiece pre-tokenizes normalized text free of added tokens and
// appends the BPE ids of every pre-token.
func (t *Tokenizer) encodePiece(ids []uint32, s string, sc *scratch) []uint32 {
	if d := t.scanDigits; d != 0 {
		return t.encodeScanned(ids, s, sc, d)
	}
	sc.pieces = t.pre.split(sc.pieces[:0], s)
	for _, w := range sc.pieces {
		ids = t.model.encodeWord(ids, w, sc)
	}
	clear(sc.pieces) // drop references into the caller's text
	return ids
}

// encodeScanned is encodePiece for a pre-tokenizer that is one Qwen or
// Llama-3 Split (maxDigits d): each pre-token is encoded as the scan finds
// it (pipeline.split's pieces, without the slice of them). The commonest
// cases are decided here without a call, each as its general path decides
// it: a pre-token that starts with a letter or with a space then a letter
// (scanCL100KFast's letter runs), a mark before a space (a run of marks of
// one), a one-byte pre-token (encodeWord's byte id) and a word of 2 to 16
// bytes in the front cache (encodeWord's front cache hit, same key, set
// and compare).
func (t *Tokenizer) encodeScanned(ids []uint32, s string, sc *scratch, d int) []uint32 {
	m := t.model
	front := m.cache != nil && !m.ignoreMerges
	for i := 0; i < len(s); {
		var j int
		letters := -1 // where a run of letters that ends the pre-token starts
		switch b := s[i]; {
		case b == ' ' && i+1 < len(s) && byteClass[s[i+1]] == clsLetter:
			letters = i + 2
		case byteClass[b] == clsLetter:
			letters = i + 1
		case byteClass[b] == clsOther && b != '\'' && i+1 < len(s) && s[i+1] == ' ':
			// One mark before a space (a comma, a full stop): its run of
			// marks is itself, and no line break follows it.
			j = i + 1
		default:
			j = scanCL100KFast(s, i, d)
		}
		if letters >= 0 {
			// skipLetters, its first eight bytes tested here: most words
			// end within them.
			if letters+8 > len(s) {
				j = skipLetters(s, letters)
			} else if lb := letterBytes(le64(s[letters:])); lb == highBits {
				j = skipLetters(s, letters+8)
			} else {
				j = letters + bits.TrailingZeros64(^lb&highBits)>>3
				if s[j] >= utf8.RuneSelf {
					j = -1
				}
			}
		}
		if j < 0 {
			j = scanCL100K(s, i, d)
		}
		w := s[i:j]
		i = j
		n := len(w)
		if n == 1 {
			ids = append(ids, m.byteID[w[0]])
			continue
		}
		if front && n <= 16 {
			var k wordKey // keyOf(w)
			switch {
			case n >= 8:
				k.a, k.b = le64(w), le64(w[n-8:])
			case n >= 4:
				k.a = uint64(le32(w)) | uint64(le32(w[n-4:]))<<32
			default:
				k.a = uint64(w[0]) | uint64(w[n>>1])<<8 | uint64(w[n-1])<<16
			}
			set := frontSet(k, n)
			e := &sc.front.e[set]
			if len(e.w) != n || e.k != k {
				e = &sc.front.e[set+1]
			}
			if len(e.w) == n && e.k == k {
				ids = appendIDs(ids, e.ids)
				continue
			}
		}
		ids = m.encodeWord(ids, w, sc)
	}
	return ids
}

// appendIDs is append(dst, ids...), without a copy call for the one id
// most words are.
func appendIDs(dst, ids []uint32) []uint32 {
	if len(ids) == 1 {
		return append(dst, ids[0])
	}
	return append(dst, ids...)
}

// validUTF8 replaces each byte of an invalid UTF-8 sequence with U+FFFD.
func validUTF8(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	b := make([]byte, 0, len(s)+8)
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			b = utf8.AppendRune(b, utf8.RuneError)
		} else {
			b = append(b, s[i:i+n]...)
		}
		i += n
	}
	return string(b)
}
