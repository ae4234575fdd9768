package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// bpe is a byte-level BPE model. Vocabulary entries are stored by their
// raw bytes (the GPT-2 byte-to-char mapping undone), so words are merged
// directly on the UTF-8 bytes of the pre-token.
type bpe struct {
	vocab  *vocabIndex       // raw bytes of each byte-level vocab entry -> id
	tokens byteTable         // id -> vocab key as written in tokenizer.json ("" if unused)
	odd    map[string]uint32 // vocab keys outside the byte-level alphabet
	size   uint32            // number of vocab entries (Hugging Face's get_vocab_size)
	byteID [256]uint32       // id of each single byte
	merges mergeTable        // (left id, right id) -> merge
	// ignoreMerges: a pre-token that is itself a vocab entry is emitted
	// whole, without merging (Llama-3).
	ignoreMerges bool
	cache        *wordCache
}

// merge is the result of merging a pair: its rank (lower merges first)
// and the id of the merged token.
type merge struct {
	rank uint32
	id   uint32
}

// sparseVocabSlack bounds vocabulary ids to 2*len(vocab)+sparseVocabSlack
// (real vocabularies are dense, ids 0..n-1), so a hostile file cannot make
// the id-indexed tables huge.
const sparseVocabSlack = 1 << 16

func pairKey(a, b uint32) uint64 { return uint64(a)<<32 | uint64(b) }

type modelJSON struct {
	Type                    string            `json:"type"`
	Dropout                 *float64          `json:"dropout"`
	UnkToken                *string           `json:"unk_token"`
	ContinuingSubwordPrefix *string           `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string           `json:"end_of_word_suffix"`
	FuseUnk                 bool              `json:"fuse_unk"`
	ByteFallback            bool              `json:"byte_fallback"`
	IgnoreMerges            bool              `json:"ignore_merges"`
	Vocab                   map[string]uint32 `json:"vocab"`
	Merges                  json.RawMessage   `json:"merges"`
}

// parseModel decodes "model"; only BPE over the byte-level alphabet is
// supported.
func parseModel(raw json.RawMessage) (*bpe, error) {
	if isNull(raw) {
		return nil, errors.New("missing")
	}
	var m modelJSON
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, err
	}
	if m.Type != "BPE" && !(m.Type == "" && m.Vocab != nil && m.Merges != nil) {
		return nil, fmt.Errorf("type %q not supported (only BPE)", m.Type)
	}
	switch {
	case m.Dropout != nil && *m.Dropout != 0:
		return nil, errors.New("BPE dropout not supported")
	case m.ContinuingSubwordPrefix != nil && *m.ContinuingSubwordPrefix != "":
		return nil, errors.New("BPE continuing_subword_prefix not supported")
	case m.EndOfWordSuffix != nil && *m.EndOfWordSuffix != "":
		return nil, errors.New("BPE end_of_word_suffix not supported")
	case m.ByteFallback:
		return nil, errors.New("BPE byte_fallback not supported")
	}
	b := &bpe{odd: map[string]uint32{},
		size: uint32(len(m.Vocab)), ignoreMerges: m.IgnoreMerges, cache: newWordCache()}
	var maxID uint32
	raws := make([]string, 0, len(m.Vocab))
	rawIDs := make([]uint32, 0, len(m.Vocab))
	for tok, id := range m.Vocab {
		maxID = max(maxID, id)
		if raw, ok := byteLevelDecode(tok); ok {
			raws = append(raws, raw)
			rawIDs = append(rawIDs, id)
		} else {
			b.odd[tok] = id
		}
	}
	if limit := 2*len(m.Vocab) + sparseVocabSlack; int(maxID) >= limit {
		return nil, fmt.Errorf("vocab id %d too large for %d entries (ids must be below %d)", maxID, len(m.Vocab), limit)
	}
	b.vocab = newVocabIndex(raws, rawIDs)
	toks := make([]string, int(maxID)+1)
	for tok, id := range m.Vocab {
		toks[id] = tok
	}
	for _, tok := range toks {
		b.tokens.add(tok)
	}
	b.tokens = b.tokens.clip()
	for c := range 256 {
		id, ok := b.vocab.get(string([]byte{byte(c)}))
		if !ok {
			return nil, fmt.Errorf("vocab lacks the byte-level symbol %q for byte 0x%02x; not a byte-level BPE", byteToChar[c], c)
		}
		b.byteID[c] = id
	}
	pairs, err := parseMerges(m.Merges)
	if err != nil {
		return nil, err
	}
	b.merges = newMergeTable(len(pairs))
	for rank, p := range pairs {
		a, ok1 := m.Vocab[p[0]]
		c, ok2 := m.Vocab[p[1]]
		n, ok3 := m.Vocab[p[0]+p[1]]
		if !ok1 || !ok2 || !ok3 {
			return nil, fmt.Errorf("merges[%d] %q %q: token not in vocab", rank, p[0], p[1])
		}
		// Like Hugging Face's HashMap collect, a repeated pair keeps its
		// last rank.
		b.merges.put(pairKey(a, c), merge{rank: uint32(rank), id: n})
	}
	return b, nil
}

// parseMerges accepts both merge forms: "a b" strings and ["a", "b"] pairs.
func parseMerges(raw json.RawMessage) ([][2]string, error) {
	if isNull(raw) {
		return nil, nil
	}
	var asStrings []string
	if err := json.Unmarshal(raw, &asStrings); err == nil {
		out := make([][2]string, len(asStrings))
		for i, s := range asStrings {
			a, b, ok := strings.Cut(s, " ")
			if !ok || strings.Contains(b, " ") {
				return nil, fmt.Errorf("merges[%d] %q: want \"left right\"", i, s)
			}
			out[i] = [2]string{a, b}
		}
		return out, nil
	}
	var asPairs [][2]string
	if err := json.Unmarshal(raw, &asPairs); err != nil {
		return nil, fmt.Errorf("merges: want strings or [left, right] pairs: %w", err)
	}
	return asPairs, nil
}

// tokenID looks up a vocab entry by its key as written in tokenizer.json.
func (b *bpe) tokenID(tok string) (uint32, bool) {
	if raw, ok := byteLevelDecode(tok); ok {
		id, ok := b.vocab.get(raw)
		return id, ok
	}
	id, ok := b.odd[tok]
	return id, ok
}

// encodeWord appends the ids of one pre-token (raw bytes) to dst.
func (b *bpe) encodeWord(dst []uint32, w string, sc *scratch) []uint32 {
	if len(w) == 1 {
		return append(dst, b.byteID[w[0]])
	}
	if b.ignoreMerges {
		if id, ok := b.vocab.get(w); ok {
			return append(dst, id)
		}
	}
	cacheable := len(w) <= maxCachedWord && b.cache != nil
	if !cacheable {
		return b.mergeWord(dst, w, sc)
	}
	k := keyOf(w)
	set := frontSet(k, len(w))
	if ids, ok := sc.front.get(set, k, w); ok {
		return appendIDs(dst, ids)
	}
	ids, ok := b.cache.get(w)
	if !ok {
		start := len(dst)
		dst = b.mergeWord(dst, w, sc)
		sc.front.set(set, k, w, b.cache.put(w, dst[start:]))
		return dst
	}
	sc.front.set(set, k, w, ids)
	return appendIDs(dst, ids)
}
