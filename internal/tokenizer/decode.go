package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"unicode/utf8"
)

// byteToChar is GPT-2's byte-to-unicode table: printable Latin-1 bytes map
// to themselves, the other 68 bytes to U+0100 onwards in byte order.
var byteToChar = func() (t [256]rune) {
	next := rune(256)
	for b := range 256 {
		if b >= '!' && b <= '~' || b >= 0xA1 && b <= 0xAC || b >= 0xAE {
			t[b] = rune(b)
		} else {
			t[b] = next
			next++
		}
	}
	return t
}()

// charToByte inverts byteToChar; -1 for characters outside the alphabet
// (all byte-level characters are below U+0144).
var charToByte = func() (t [0x144]int16) {
	for i := range t {
		t[i] = -1
	}
	for b, r := range byteToChar {
		t[r] = int16(b)
	}
	return t
}()

// byteLevelDecode maps a byte-level string back to raw bytes; ok is false
// when a character is outside the byte-level alphabet.
func byteLevelDecode(tok string) (string, bool) {
	b := make([]byte, 0, len(tok))
	for _, r := range tok {
		if r >= rune(len(charToByte)) || charToByte[r] < 0 {
			return "", false
		}
		b = append(b, byte(charToByte[r]))
	}
	return string(b), true
}

// parseDecoder accepts the ByteLevel decoder, alone or as the only kind of
// step in a Sequence.
func parseDecoder(raw json.RawMessage) error {
	if isNull(raw) {
		return errors.New("missing; byte-level BPE needs the ByteLevel decoder")
	}
	var t typed
	if err := json.Unmarshal(raw, &t); err != nil {
		return err
	}
	switch t.Type {
	case "ByteLevel":
		return nil
	case "Sequence":
		var s struct {
			Decoders []json.RawMessage `json:"decoders"`
		}
		if err := json.Unmarshal(raw, &s); err != nil {
			return fmt.Errorf("%s: %w", t.Type, err)
		}
		for i, d := range s.Decoders {
			var dt typed
			if err := json.Unmarshal(d, &dt); err != nil || dt.Type != "ByteLevel" {
				return fmt.Errorf("%s[%d]: type %q not supported", t.Type, i, dt.Type)
			}
		}
		return nil
	default:
		return fmt.Errorf("type %q not supported", t.Type)
	}
}

// buildDecodeTable precomputes each id's bytes as Hugging Face's ByteLevel
// decoder produces them: the token string (an added token's content takes
// precedence over the vocabulary, normalized if the token is) mapped char by char to bytes, or the
// token's own UTF-8 bytes when a character is outside the byte-level
// alphabet.
func (t *Tokenizer) buildDecodeTable() {
	n := t.model.tokens.len()
	for id := range t.added.byID {
		n = max(n, int(id)+1)
	}
	toks := make([]string, n)
	for id := range t.model.tokens.len() {
		toks[id] = string(t.model.tokens.at(uint32(id)))
	}
	for id, a := range t.added.byID {
		content := a.Content
		if a.Normalized && t.norm != nil {
			// Hugging Face's id_to_token gives a normalized added
			// token's content normalized.
			content = t.norm.normalize(content)
		}
		toks[id] = content
	}
	t.dec = newDecodeTable(toks)
}

// newDecodeTable builds the decode table of toks (indexed by id; "" for
// an unused id): each token's byte-level string mapped back to raw bytes,
// or its own UTF-8 bytes when a character is outside the byte-level
// alphabet.
func newDecodeTable(toks []string) byteTable {
	var d byteTable
	for _, tok := range toks {
		if raw, ok := byteLevelDecode(tok); ok {
			d.add(raw)
		} else {
			d.add(tok)
		}
	}
	return d.clip()
}

// Decode returns the text of ids, skipping nothing (special tokens are
// included), as Hugging Face's decode(ids, skip_special_tokens=False).
// Byte sequences that are not valid UTF-8 become U+FFFD, one per maximal
// invalid subpart (Rust's String::from_utf8_lossy). Unknown ids are
// skipped, as Hugging Face skips ids it cannot map. For valid UTF-8 s
// without literal added tokens, Decode(Encode(s, false)) is s normalized
// by the tokenizer's normalizer.
func (t *Tokenizer) Decode(ids []uint32) string {
	var b []byte
	for _, id := range ids {
		if int(id) < t.dec.len() {
			b = append(b, t.dec.at(id)...)
		}
	}
	return lossyUTF8(b)
}

// lossyUTF8 converts b to a string, replacing each maximal subpart of an
// ill-formed sequence with U+FFFD (Unicode's recommended practice, which
// Rust's from_utf8_lossy follows).
func lossyUTF8(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	out := make([]byte, 0, len(b)+8)
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r != utf8.RuneError || n > 1 {
			out = append(out, b[i:i+n]...)
			i += n
			continue
		}
		out = utf8.AppendRune(out, utf8.RuneError)
		i += maximalSubpart(b[i:])
	}
	return string(out)
}

// maximalSubpart is the length (>= 1) of the longest prefix of b that
// starts a well-formed UTF-8 sequence but does not complete it (Unicode
// Table 3-7); b[0] does not start a valid sequence.
func maximalSubpart(b []byte) int {
	c := b[0]
	var need int
	lo, hi := byte(0x80), byte(0xBF)
	switch {
	case c >= 0xC2 && c <= 0xDF:
		need = 1
	case c == 0xE0:
		need, lo = 2, 0xA0
	case c >= 0xE1 && c <= 0xEC, c == 0xEE, c == 0xEF:
		need = 2
	case c == 0xED:
		need, hi = 2, 0x9F
	case c == 0xF0:
		need, lo = 3, 0x90
	case c >= 0xF1 && c <= 0xF3:
		need = 3
	case c == 0xF4:
		need, hi = 3, 0x8F
	default:
		return 1
	}
	k := 1
	for ; k <= need && k < len(b); k++ {
		if b[k] < lo || b[k] > hi {
			break
		}
		lo, hi = 0x80, 0xBF
	}
	return k
}
