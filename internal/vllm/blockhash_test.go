package vllm

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"math/rand/v2"
	"os"
	"os/exec"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/fxamacker/cbor/v2"
)

// hashCase is one case of testdata/vllm/blockhash.json (see its README).
type hashCase struct {
	Name      string   `json:"name"`
	Algo      string   `json:"algo"`
	Seed      string   `json:"pythonhashseed"`
	BlockSize int      `json:"block_size"`
	Tokens    []uint32 `json:"tokens"`
	Request   struct {
		LoRAName  *string `json:"lora_name"`
		CacheSalt *string `json:"cache_salt"`
		MM        []struct {
			Identifier string `json:"identifier"`
			Offset     int    `json:"offset"`
			Length     int    `json:"length"`
		} `json:"mm_features"`
	} `json:"request"`
	ExtraKeys     json.RawMessage `json:"extra_keys_per_block"`
	NoneHash      string          `json:"none_hash_hex"`
	NoneHashInput string          `json:"none_hash_input_hex"`
	Digests       []string        `json:"block_digests_hex"`
	EventValues   []string        `json:"event_values"`
	Serialized    []string        `json:"serialized_hex"`
}

func (c *hashCase) keys() RequestKeys {
	var r RequestKeys
	if c.Request.LoRAName != nil {
		r.LoRAName = *c.Request.LoRAName
	}
	if c.Request.CacheSalt != nil {
		r.CacheSalt = *c.Request.CacheSalt
	}
	for _, m := range c.Request.MM {
		r.MM = append(r.MM, MMFeature{Identifier: m.Identifier, Offset: m.Offset, Length: m.Length})
	}
	return r
}

func loadHashCases(t testing.TB) []hashCase {
	raw, err := os.ReadFile("../../testdata/vllm/blockhash.json")
	if err != nil {
		t.Fatal(err)
	}
	var cases []hashCase
	if err := json.Unmarshal(raw, &cases); err != nil {
		t.Fatal(err)
	}
	if len(cases) != 25 {
		t.Fatalf("blockhash.json has %d cases, want 25", len(cases))
	}
	return cases
}

// TestBlockHashGolden checks, for every golden case: NONE_HASH and its
// input bytes, each block's extra keys, serialised bytes, digest and event
// value, via both HashPrompt and a HashBlock chain.
func TestBlockHashGolden(t *testing.T) {
	for _, c := range loadHashCases(t) {
		t.Run(c.Name, func(t *testing.T) {
			algo, err := ParseHashAlgo(c.Algo)
			if err != nil {
				t.Fatal(err)
			}
			h, err := NewBlockHasher(algo, c.Seed, nil)
			if err != nil {
				t.Fatal(err)
			}
			if got := hex.EncodeToString(h.NoneHash()); got != c.NoneHash {
				t.Errorf("NONE_HASH = %s, want %s", got, c.NoneHash)
			}
			if got := hex.EncodeToString(h.serializeString(c.Seed)); got != c.NoneHashInput {
				t.Errorf("NONE_HASH input = %s, want %s", got, c.NoneHashInput)
			}
			req := c.keys()
			n := len(c.Tokens) / c.BlockSize
			if len(c.Digests) != n || len(c.EventValues) != n || len(c.Serialized) != n {
				t.Fatalf("golden case has %d digests for %d full blocks", len(c.Digests), n)
			}
			// Extra keys per block, compared as JSON.
			keys := make([]any, n)
			for i := range n {
				keys[i] = BlockExtraKeys(req, i*c.BlockSize, (i+1)*c.BlockSize)
			}
			if got, want := canonicalJSON(t, keys), canonicalJSON(t, json.RawMessage(c.ExtraKeys)); got != want {
				t.Errorf("extra keys\n got %s\nwant %s", got, want)
			}
			digests := h.HashPrompt(c.Tokens, c.BlockSize, req)
			if len(digests) != n {
				t.Fatalf("HashPrompt returned %d digests, want %d", len(digests), n)
			}
			parent := []byte(nil)
			for i := range n {
				tokens := c.Tokens[i*c.BlockSize : (i+1)*c.BlockSize]
				ek, _ := keys[i].([]any)
				s, err := h.serializeBlock(orNone(h, parent), tokens, ek)
				if err != nil {
					t.Fatal(err)
				}
				if got := hex.EncodeToString(s); got != c.Serialized[i] {
					t.Errorf("block %d serialised\n got %s\nwant %s", i, got, c.Serialized[i])
				}
				if algo.cbor() {
					ref, err := fxamackerBlock(orNone(h, parent), tokens, ek)
					if err != nil || !bytes.Equal(ref, s) {
						t.Errorf("block %d: fxamacker/cbor canonical gives %x (%v)", i, ref, err)
					}
				}
				d := h.HashBlock(parent, tokens, ek)
				if got := hex.EncodeToString(d); got != c.Digests[i] {
					t.Errorf("block %d HashBlock = %s, want %s", i, got, c.Digests[i])
				}
				if got := hex.EncodeToString(digests[i]); got != c.Digests[i] {
					t.Errorf("block %d HashPrompt = %s, want %s", i, got, c.Digests[i])
				}
				if got := strconv.FormatUint(uint64(EventValue(d)), 10); got != c.EventValues[i] {
					t.Errorf("block %d event value = %s, want %s", i, got, c.EventValues[i])
				}
				parent = d
			}
		})
	}
}

func orNone(h *BlockHasher, parent []byte) []byte {
	if parent == nil {
		return h.NoneHash()
	}
	return parent
}

// fxamackerBlock is the reference CBOR serialisation of a block input.
func fxamackerBlock(parent []byte, tokens []uint32, extra []any) ([]byte, error) {
	em, err := cbor.CanonicalEncOptions().EncMode()
	if err != nil {
		return nil, err
	}
	var ek any
	if extra != nil {
		ek = extra
	}
	return em.Marshal([]any{parent, tokens, ek})
}

func TestNoneHashSeed(t *testing.T) {
	seq := bytes.Repeat([]byte{7}, 64)
	h, err := NewBlockHasher(HashXXHash, "", bytes.NewReader(seq))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(h.NoneHash(), seq[:32]) {
		t.Errorf("unset seed: NONE_HASH = %x, want 32 bytes from the reader", h.NoneHash())
	}
	if _, err := NewBlockHasher(HashSHA256, "", bytes.NewReader(nil)); err == nil {
		t.Error("a failing random reader must be an error")
	}
	a, _ := NewBlockHasher(HashSHA256CBOR, "", nil)
	b, _ := NewBlockHasher(HashSHA256CBOR, "", nil)
	if len(a.NoneHash()) != 32 || bytes.Equal(a.NoneHash(), b.NoneHash()) {
		t.Error("unset seed with crypto/rand: want two different 32-byte NONE_HASHes")
	}
	// "random" is hashed literally, like any other seed string.
	// Expected values from Python: hashlib.sha256(b"\x66random") and
	// hashlib.sha256(pickle.dumps("random", protocol=5)).
	for algo, want := range map[HashAlgo]string{
		HashSHA256CBOR: "78d6ac7e28de859e492449dcea03e3807377d69998c5af819fed33a6df490cad",
		HashSHA256:     "fa1326fc0ad784c54e10f808051a77f999f7b675b12fba49cbef92b3e1a09cb7",
	} {
		r, err := NewBlockHasher(algo, "random", nil)
		if err != nil || hex.EncodeToString(r.NoneHash()) != want {
			t.Errorf("%s seed \"random\": NONE_HASH = %x, want %s (%v)", algo, r.NoneHash(), want, err)
		}
	}
	if _, err := NewBlockHasher("builtin", "0", nil); err == nil || !strings.Contains(err.Error(), "unknown hash algorithm") {
		t.Errorf("NewBlockHasher(builtin) err = %v", err)
	}
	if a, err := ParseHashAlgo("xxhash_cbor"); err != nil || a != HashXXHashCBOR || a.DigestSize() != 16 {
		t.Errorf("ParseHashAlgo(xxhash_cbor) = %v, %v", a, err)
	}
}

// TestBlockExtraKeysMM covers the MM scan around block edges: an item ending
// exactly where a block starts belongs to the earlier block only, an item
// starting where a block ends belongs to the later one, and several items
// may share a block.
func TestBlockExtraKeysMM(t *testing.T) {
	req := RequestKeys{MM: []MMFeature{{"a", 0, 16}, {"b", 16, 4}, {"c", 22, 20}, {"d", 48, 1}}}
	tests := []struct {
		start, end int
		want       []any
	}{
		{0, 16, []any{[]any{"a", int64(0)}}},
		{16, 32, []any{[]any{"b", int64(0)}, []any{"c", int64(6)}}},
		{32, 48, []any{[]any{"c", int64(-10)}}},
		{48, 64, []any{[]any{"d", int64(0)}}},
		{64, 80, nil},
	}
	h, _ := NewBlockHasher(HashSHA256CBOR, "0", nil)
	tokens := make([]uint32, 80)
	digests := h.HashPrompt(tokens, 16, req)
	parent := []byte(nil)
	for i, tt := range tests {
		got := BlockExtraKeys(req, tt.start, tt.end)
		if !reflect.DeepEqual(got, tt.want) {
			t.Errorf("[%d,%d): %v, want %v", tt.start, tt.end, got, tt.want)
		}
		// HashPrompt (chained MM index) must agree with the stateless scan.
		d := h.HashBlock(parent, tokens[tt.start:tt.end], got)
		if !bytes.Equal(d, digests[i]) {
			t.Errorf("block %d: HashPrompt differs from HashBlock with BlockExtraKeys", i)
		}
		parent = d
	}
}

func TestPromptEmbedsKey(t *testing.T) {
	emb := make([]byte, 4*8) // 4 tokens, 8 bytes each
	for i := range emb {
		emb[i] = byte(i)
	}
	req := RequestKeys{LoRAName: "l", PromptEmbeds: emb, PromptEmbedsRowBytes: 8}
	got := BlockExtraKeys(req, 2, 4)
	if len(got) != 2 || got[0] != "l" {
		t.Fatalf("keys = %v", got)
	}
	sum := sha256.Sum256(emb[16:32])
	want := sum[:]
	if d, ok := got[1].([]byte); !ok || !bytes.Equal(d, want) {
		t.Errorf("prompt-embeds key = %x, want sha256 of rows 2..4 %x", got[1], want)
	}
}

// TestCBORMatchesFxamacker compares the append-style CBOR writer with
// fxamacker/cbor CanonicalEncOptions on random block inputs covering every
// head width, negative ints, long and non-ASCII strings, nesting and floats.
func TestCBORMatchesFxamacker(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	h, _ := NewBlockHasher(HashXXHashCBOR, "0", nil)
	ints := []int64{0, 23, 24, 255, 256, 65535, 65536, 1<<32 - 1, 1 << 32, -1, -24, -25, -256, -257, -65537, -1 << 40}
	for range 500 {
		tokens := make([]uint32, rng.IntN(40))
		for i := range tokens {
			tokens[i] = uint32(ints[rng.IntN(7)]) + uint32(rng.IntN(3))
		}
		var extra []any
		if rng.IntN(4) > 0 {
			for range rng.IntN(5) {
				switch rng.IntN(6) {
				case 0:
					extra = append(extra, strings.Repeat("é", rng.IntN(300)))
				case 1:
					extra = append(extra, []any{"mm", ints[rng.IntN(len(ints))]})
				case 2:
					extra = append(extra, bytes.Repeat([]byte{1}, rng.IntN(40)))
				case 3:
					extra = append(extra, uint64(1<<63+rng.Uint64N(1<<62)))
				case 4:
					extra = append(extra, []float64{0.5, 1.1, 65504, 1e300}[rng.IntN(4)], nil, true)
				default:
					extra = append(extra, []any{})
				}
			}
			if extra == nil {
				extra = []any{}
			}
		}
		parent := bytes.Repeat([]byte{9}, 16+16*rng.IntN(2))
		got, err := h.serializeBlock(parent, tokens, extra)
		if err != nil {
			t.Fatal(err)
		}
		want, err := fxamackerBlock(parent, tokens, extra)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("extra %v tokens %v:\n got %x\nwant %x", extra, tokens, got, want)
		}
	}
}

func TestHashBlockErrors(t *testing.T) {
	for _, algo := range []HashAlgo{HashSHA256, HashSHA256CBOR} {
		h, _ := NewBlockHasher(algo, "0", nil)
		if _, err := h.AppendBlockHash(nil, nil, []uint32{1}, []any{struct{}{}}); err == nil {
			t.Errorf("%s: unsupported extra key type must fail", algo)
		}
		deep := any("x")
		for range maxDepth + 2 {
			deep = []any{deep}
		}
		if _, err := h.AppendBlockHash(nil, nil, []uint32{1}, []any{deep}); err == nil || !strings.Contains(err.Error(), "deeper") {
			t.Errorf("%s: deep nesting err = %v", algo, err)
		}
	}
	h, _ := NewBlockHasher(HashXXHash, "0", nil)
	if h.HashPrompt([]uint32{1, 2}, 0, RequestKeys{}) != nil {
		t.Error("block size 0 must give no digests")
	}
}

// TestHashAllocs: hashing a plain or LoRA prompt allocates only its result
// (the digest array and the slice headers), not per block.
func TestHashAllocs(t *testing.T) {
	tokens := make([]uint32, 32*16)
	for _, algo := range []HashAlgo{HashSHA256, HashSHA256CBOR, HashXXHash, HashXXHashCBOR} {
		h, _ := NewBlockHasher(algo, "0", nil)
		req := RequestKeys{LoRAName: "my-lora", CacheSalt: "salt"}
		h.HashPrompt(tokens, 16, req) // warm the buffers
		if a := testing.AllocsPerRun(20, func() { h.HashPrompt(tokens, 16, req) }); a > 4 {
			t.Errorf("%s: HashPrompt of 32 blocks allocates %v times, want <= 4", algo, a)
		}
		dst := make([]byte, 0, 32)
		if a := testing.AllocsPerRun(20, func() { _, _ = h.AppendBlockHash(dst[:0], nil, tokens[:16], nil) }); a != 0 {
			t.Errorf("%s: AppendBlockHash allocates %v times, want 0", algo, a)
		}
	}
}

// pyPickleScript reads JSON cases [{"parent": hex, "tokens": [...], "extra":
// ...}] and prints pickle.dumps((parent, tuple(tokens), extra), protocol=5)
// in hex per line. JSON arrays become tuples, {"b": hex} bytes, {"f": x}
// floats.
const pyPickleScript = `
import json, pickle, sys
def conv(v):
    if isinstance(v, list):
        return tuple(conv(x) for x in v)
    if isinstance(v, dict):
        return bytes.fromhex(v["b"]) if "b" in v else float(v["f"])
    return v
for c in json.load(sys.stdin):
    x = (bytes.fromhex(c["parent"]), tuple(c["tokens"]), conv(c["extra"]))
    print(pickle.dumps(x, protocol=5).hex())
`

// TestPickleMatchesCPython compares the pickle writer with CPython's on the
// edges golden data does not reach: 64 KiB frame splits, payloads written
// outside frames, LONG1 ints, interned 1-char strings (BINGET and
// LONG_BINGET), every str/bytes header width and tuple size. It needs
// /usr/bin/python3 (Debian's, as the ZeroMQ interop test does) and is
// skipped without it.
func TestPickleMatchesCPython(t *testing.T) {
	const py = "/usr/bin/python3"
	if _, err := os.Stat(py); err != nil {
		t.Skip("no /usr/bin/python3")
	}
	type pcase struct {
		Parent string   `json:"parent"`
		Tokens []uint32 `json:"tokens"`
		Extra  any      `json:"extra"`
	}
	rep := func(v uint32, n int) []uint32 {
		s := make([]uint32, n)
		for i := range s {
			s[i] = v
		}
		return s
	}
	many := make([]any, 0, 303)
	for i := range 300 {
		many = append(many, "s"+strconv.Itoa(i))
	}
	many = append(many, "a", "a", "é")
	p32 := strings.Repeat("ab", 16)
	cases := []pcase{
		{p32, rep(300, 21833), nil},
		{p32, rep(300, 21834), nil},
		{p32, rep(300, 21835), nil},
		{p32, rep(70000, 13200), []any{"x"}},
		{p32, []uint32{0, 255, 256, 65535, 65536, 1<<31 - 1, 1 << 31, 1<<32 - 1}, nil},
		{p32, []uint32{1}, []any{int64(-1), int64(-1 << 31), int64(-1<<31 - 1), int64(-1 << 63), int64(1<<63 - 1), uint64(1<<64 - 1), int64(-129), int64(-32768), int64(-32769), int64(128 << 24)}},
		{p32, []uint32{1, 2}, []any{"a", "a", "é", "é", "€", "€", "", "", "aa", "aa"}},
		{p32, []uint32{1, 2, 3}, []any{strings.Repeat("y", 255), strings.Repeat("y", 256), strings.Repeat("z", 65535), strings.Repeat("z", 65536), "after"}},
		{p32, []uint32{4}, []any{strings.Repeat("q", 70000), "b", "b"}},
		{p32, []uint32{5}, []any{map[string]string{"b": ""}, map[string]string{"b": strings.Repeat("00", 255)}, map[string]string{"b": strings.Repeat("01", 256)}, map[string]string{"b": strings.Repeat("02", 65536)}}},
		{p32, []uint32{6}, []any{[]any{}, []any{"m", int64(3)}, []any{1, 2, 3}, []any{1, 2, 3, 4}, []any{[]any{[]any{"deep"}}}, true, false, nil, map[string]float64{"f": 1.5}}},
		{p32, []uint32{7}, many},
		{strings.Repeat("cd", 16), rep(1, 1), []any{"lora", []any{"lora:mm", int64(-6)}, "salt"}},
	}
	in, err := json.Marshal(cases)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(py, "-c", pyPickleScript)
	cmd.Stdin = bytes.NewReader(in)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("python: %v", err)
	}
	lines := strings.Fields(string(out))
	if len(lines) != len(cases) {
		t.Fatalf("python printed %d lines for %d cases", len(lines), len(cases))
	}
	h, _ := NewBlockHasher(HashSHA256, "0", nil)
	for i, c := range cases {
		parent, _ := hex.DecodeString(c.Parent)
		var extra []any
		if c.Extra != nil {
			extra = toGoExtra(c.Extra).([]any)
		}
		got, err := h.serializeBlock(parent, c.Tokens, extra)
		if err != nil {
			t.Fatal(err)
		}
		if want := lines[i]; hex.EncodeToString(got) != want {
			t.Errorf("case %d: pickle differs from CPython (len %d vs %d)\n got %.200x\nwant %.200s", i, len(got), len(want)/2, got, want)
		}
	}
}

// toGoExtra turns the JSON-friendly test values into extra-key items.
func toGoExtra(v any) any {
	switch x := v.(type) {
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = toGoExtra(e)
		}
		return out
	case map[string]string:
		b, _ := hex.DecodeString(x["b"])
		return b
	case map[string]float64:
		return x["f"]
	}
	return v
}
